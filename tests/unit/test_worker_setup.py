"""The setup every worker shares (`harness.setup`, `procfs.reset_resident_peak`)."""

from __future__ import annotations

from loadpolicy_lab.harness.procfs import memory_status, reset_resident_peak
from loadpolicy_lab.harness.setup import zero3_config


def test_zero3_config_spans_the_world_and_adds_to_its_section() -> None:
    config = zero3_config(4, micro_batch=2, zero={"reduce_bucket_size": 5}, bf16={"enabled": True})
    assert config == {
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 5},
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": True},
    }
    assert zero3_config(2) == {
        "zero_optimization": {"stage": 3},
        "train_batch_size": 2,
        "train_micro_batch_size_per_gpu": 1,
    }


def test_the_resident_peak_is_reset_to_what_is_resident_now() -> None:
    block = bytearray(256 << 20)  # touched: resident, and the peak
    block[::4096] = b"x" * len(block[::4096])
    del block
    before = memory_status()
    assert before["VmHWM"] - before["VmRSS"] > 128 << 20
    reset_resident_peak()
    after = memory_status()
    assert after["VmHWM"] - after["VmRSS"] < 64 << 20
