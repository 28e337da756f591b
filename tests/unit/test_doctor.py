from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadpolicy.cli import main
from loadpolicy.doctor import Severity, check_deepspeed_config, parse_version
from loadpolicy.policy import LoadPolicyError, ParallelSizes


def zero3(optimizer: str | None = None, param: str | None = None) -> dict[str, object]:
    zero: dict[str, object] = {"stage": 3}
    if optimizer is not None:
        zero["offload_optimizer"] = {"device": optimizer}
    if param is not None:
        zero["offload_param"] = {"device": param}
    return {"zero_optimization": zero}


def checks(config: dict[str, object], version: str | None) -> dict[str, Severity]:
    return {f.check: f.severity for f in check_deepspeed_config(config, version)}


def test_qwen_seed_config_on_an_affected_deepspeed_is_an_error() -> None:
    # zero3-offload-device-mismatch-qwen: both offloaded to CPU, DeepSpeed in the broken range.
    assert checks(zero3("cpu", "cpu"), "0.14.2")["deepspeed-version"] is Severity.ERROR


@pytest.mark.parametrize("version", ["0.14.0", "0.14.5", "0.19.8", None])
def test_fixed_or_older_deepspeed_is_not_flagged(version: str | None) -> None:
    assert "deepspeed-version" not in checks(zero3("cpu", "cpu"), version)


def test_disagreeing_offload_devices_warn() -> None:
    found = checks(zero3("cpu", None), "0.19.8")
    assert found["offload-devices"] is Severity.WARNING
    assert "offload-devices" not in checks(zero3("cpu", "cpu"), "0.19.8")


def test_not_zero3_has_only_the_placement_note() -> None:
    assert checks({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, "0.14.2") == {
        "placement-before-initialize": Severity.NOTE
    }


def test_bad_version_names_the_value() -> None:
    with pytest.raises(LoadPolicyError, match="Cannot read DeepSpeed version 'latest'"):
        parse_version("latest")


def test_cli_exits_non_zero_on_an_error_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(zero3("cpu", "cpu")), encoding="utf-8")
    assert main(["doctor", "--deepspeed-config", str(path), "--deepspeed-version", "0.14.2"]) == 2
    assert "error: [deepspeed-version]" in capsys.readouterr().err
    assert main(["doctor", "--deepspeed-config", str(path), "--deepspeed-version", "0.19.8"]) == 0
    assert "note: [placement-before-initialize]" in capsys.readouterr().out


def test_autoep_beside_transformers_ep_is_an_error() -> None:
    config = {"zero_optimization": {"stage": 3}, "expert_parallel": {"enabled": True, "autoep_size": 2}}
    findings = check_deepspeed_config(config, "0.19.8", ParallelSizes(fsdp=4, ep=2))
    assert [f.check for f in findings if f.severity is Severity.ERROR] == ["two-expert-parallelisms"]
    assert "ep_size=2" in findings[0].message
    # AutoEP alone, without EP in the DistributedConfig, is DeepSpeed's own way
    assert not [f for f in check_deepspeed_config(config, "0.19.8") if f.severity is Severity.ERROR]


def test_the_shared_batch_shape_points_at_token_dispatch() -> None:
    config = {"zero_optimization": {"stage": 3}}
    shared = check_deepspeed_config(config, "0.19.8", ParallelSizes(tp=4, ep=4))
    assert any(f.check == "shared-batch-ep" and "fsdp_size=<world size>, ep_size=4" in f.message for f in shared)
    dispatch = check_deepspeed_config(config, "0.19.8", ParallelSizes(fsdp=4, ep=4))
    assert not any(f.check == "shared-batch-ep" for f in dispatch)


@pytest.mark.parametrize(
    "sizes",
    [
        [],
        ["--fsdp-size", "2"],
        ["--ep-size", "2"],
        ["--ep-size", "3", "--fsdp-size", "2"],
        ["--fsdp-size", "4", "--ep-size", "2"],
        ["--tp-size", "2", "--ep-size", "2"],
        ["--tp-size", "2"],
        ["--tp-size", "2", "--ep-size", "3"],
    ],
)
def test_doctor_and_explain_agree_on_the_launch(
    sizes: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One validation of the launch's sizes: a launch `explain` refuses, `doctor` refuses with the same message."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(zero3()), encoding="utf-8")
    explained = main(["explain", "--deepspeed-config", str(path), *sizes])
    explain_error = capsys.readouterr().err.partition("error: ")[2]
    doctored = main(["doctor", "--deepspeed-config", str(path), "--deepspeed-version", "0.19.8", *sizes])
    doctor_error = capsys.readouterr().err.partition("error: ")[2]
    assert explained == doctored
    assert explain_error == doctor_error


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"zero_optimization": {"stage": 3, "offload_param": "cpu"}}, "`zero_optimization.offload_param` must be"),
        ({"zero_optimization": {"stage": 3}, "expert_parallel": {"enabled": "false"}}, "`expert_parallel.enabled`"),
        ({"zero_optimization": {"stage": 3}, "expert_parallel": True}, "`expert_parallel` must be an object"),
    ],
)
def test_sections_of_the_wrong_type_are_named(
    config: dict[str, object], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    assert main(["doctor", "--deepspeed-config", str(path)]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("sizes", [["--fsdp-size", "2", "--ep-size", "2"], ["--tp-size", "2", "--ep-size", "2"]])
@pytest.mark.parametrize("command", ["doctor", "explain"])
def test_a_sharded_launch_below_zero3_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stage: int, sizes: list[str], command: str
) -> None:
    """DeepSpeed cannot wrap the DTensors EP shards into; only ZeRO-3 loads EP for it: transformers refuses others."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": stage}}), encoding="utf-8")
    assert main([command, "--deepspeed-config", str(config), *sizes]) == 2
    err = capsys.readouterr().err
    assert f"has ZeRO stage {stage}" in err
    assert "zero_optimization.stage = 3" in err


@pytest.mark.parametrize("sizes", [[], ["--tp-size", "2"]])
def test_a_launch_without_ep_below_zero3_is_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sizes: list[str]
) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}}), encoding="utf-8")
    assert main(["doctor", "--deepspeed-config", str(config), *sizes]) == 0, capsys.readouterr().err
