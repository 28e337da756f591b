"""`loadpolicy explain`, end to end through the console entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadpolicy.cli import EXAMPLES, main


@pytest.fixture
def stage3(tmp_path: Path) -> Path:
    path = tmp_path / "ds_zero3.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_batch_size": 2}), encoding="utf-8")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadpolicy", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_stage3_with_ep_is_ep_meta(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--tp-size", "2", "--ep-size", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: EPMeta")
    assert "admit_mesh_bound" in result.stdout


def test_stage3_without_ep_is_zero3_init(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: Zero3Init")


def test_no_deepspeed_config_is_meta_shard_on_read() -> None:
    result = run("explain", "--tp-size", "2", "--ep-size", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: MetaShardOnRead")


def test_stage3_with_fsdp_and_ep_is_token_dispatch(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--fsdp-size", "2", "--ep-size", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: EPMeta")
    assert "ZeRO-3 owns the 2 data-parallel ranks, tokens reach their experts by all-to-all" in result.stdout


def test_stage3_with_fsdp_is_a_clear_error(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--fsdp-size", "2")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "fsdp_size=2" in result.stderr
    assert "Accepted under ZeRO-3" in result.stderr


def test_json_output_parses(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--tp-size", "2", "--ep-size", "2", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["policy"] == "EPMeta"
    assert payload["inputs"]["ep_size"] == 2
    assert payload["inputs"]["zero3_enabled"] is True
    assert payload["decisions"]["loading_branch"]["value"] == "zero3_read_partitions"
    assert payload["decisions"]["missing_keys"]["value"] == "leave_to_zero3"
    assert payload["decisions"]["device_map"]["value"] == "admit_mesh_bound"


def test_enable_expert_parallel_alone_warns_that_ep_is_off(stage3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--deepspeed-config", str(stage3), "--enable-expert-parallel", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["policy"] == "Zero3Init"  # EP is off, so it loads as dense ZeRO-3
    assert any("expert parallelism is OFF" in warning for warning in payload["warnings"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "fast"], "accepted: 'Zero3Init', 'MetaShardOnRead', 'EPMeta'"),
        (["--deepspeed-config", "/nonexistent/ds.json"], "Cannot read DeepSpeed config"),
        (["--tp-size", "2", "--ep-size", "3"], "`ep_size` (3) must be a multiple of `tp_size` (2)"),
        (["--policy", "EPMeta"], "'EPMeta' was requested"),
    ],
)
def test_bad_input_exits_non_zero_with_message(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert needle in captured.err


def test_bad_size_is_refused_by_the_parser() -> None:
    result = run("explain", "--ep-size", "0")
    assert result.returncode == 2
    assert "expected an integer >= 1, got 0" in result.stderr


@pytest.mark.parametrize(
    ("example", "policy"),
    [
        ("ep-zero3", "EPMeta"),
        ("ep-zero3-dispatch", "EPMeta"),
        ("dense-zero3", "Zero3Init"),
        ("plain-ep", "MetaShardOnRead"),
        ("zero3-fsdp", None),
    ],
)
def test_examples(example: str, policy: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert example in EXAMPLES
    code = main(["explain", "--example", example])
    out = capsys.readouterr().out
    if policy is None:
        assert code == 2
    else:
        assert code == 0
        assert out.startswith(f"policy: {policy}")


@pytest.mark.parametrize(
    ("zero", "branch"),
    [({"stage": 3}, "zero3_read_partitions"), ({"stage": 3, "zero_hpz_partition_size": 2}, "zero3_gather_and_copy")],
)
def test_explain_dense_zero3_reads_partitions_unless_hpz(tmp_path: Path, zero: dict[str, object], branch: str) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": zero}), encoding="utf-8")
    result = run("explain", "--deepspeed-config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["decisions"]["loading_branch"]["value"] == branch
