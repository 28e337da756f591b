from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadpolicy.dsconfig import keeps_flat_partitions, read_zero_stage, zero_stage_of
from loadpolicy.policy import LoadPolicyError


@pytest.mark.parametrize(
    ("config", "stage"), [({}, 0), ({"zero_optimization": {"stage": 3}}, 3), ({"zero_optimization": {}}, 0)]
)
def test_zero_stage_of(config: dict[str, object], stage: int) -> None:
    assert zero_stage_of(config) == stage


@pytest.mark.parametrize("bad", ["auto", 4, -1, True, "3"])
def test_bad_stage_names_value_and_accepted(bad: object) -> None:
    with pytest.raises(LoadPolicyError, match=r"`zero_optimization.stage` is .*; accepted: 0, 1, 2, 3"):
        zero_stage_of({"zero_optimization": {"stage": bad}})


def test_not_an_object() -> None:
    with pytest.raises(LoadPolicyError, match="expected a JSON object"):
        zero_stage_of([1, 2])


def test_read_zero_stage(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}), encoding="utf-8")
    assert read_zero_stage(path) == 3


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LoadPolicyError, match=r"Cannot read DeepSpeed config .*nope\.json"):
        read_zero_stage(tmp_path / "nope.json")


def test_broken_json_says_where(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 3,}}', encoding="utf-8")
    with pytest.raises(LoadPolicyError, match=r"not valid JSON \(line 1, column"):
        read_zero_stage(path)


@pytest.mark.parametrize(
    ("zero", "flat"),
    [
        ({"stage": 3}, True),
        ({"stage": 3, "zero_hpz_partition_size": 1, "offload_param": {"device": "cpu"}}, True),
        ({"stage": 3, "offload_param": None}, True),
        ({"stage": 3, "zero_hpz_partition_size": 8}, False),
        ({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/local"}}, False),
        ({"stage": 3, "zero_quantized_nontrainable_weights": True}, False),
    ],
)
def test_flat_partitions_unless_deepspeed_keeps_another_copy_or_format(zero: dict[str, object], flat: bool) -> None:
    assert keeps_flat_partitions({"zero_optimization": zero}) is flat
