"""Read the facts the policy needs from a DeepSpeed config: is ZeRO stage 3 on, and how it keeps partitions."""

from __future__ import annotations

import json
from pathlib import Path

from loadpolicy.policy import LoadPolicyError


ACCEPTED_STAGES = (0, 1, 2, 3)


def zero_stage_of(config: object, source: str = "DeepSpeed config") -> int:
    """The ZeRO stage of a parsed DeepSpeed config; 0 when `zero_optimization.stage` is absent.

    Mirrors `HfDeepSpeedConfig`, which reads `zero_optimization.stage` and treats ZeRO-3 as `stage == 3`, but refuses
    values DeepSpeed itself would refuse instead of silently loading as "not ZeRO-3".
    """
    if not isinstance(config, dict):
        raise LoadPolicyError(f"{source}: expected a JSON object at the top level, got {type(config).__name__}.")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise LoadPolicyError(f"{source}: `zero_optimization` must be an object, got {zero!r}.")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in ACCEPTED_STAGES:
        raise LoadPolicyError(
            f"{source}: `zero_optimization.stage` is {stage!r}; accepted: {', '.join(map(str, ACCEPTED_STAGES))}."
        )
    return int(stage)


# DeepSpeed's `OffloadDeviceEnum`: the values `offload_param.device` and `offload_optimizer.device` accept.
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def check_sections(config: dict[str, object], source: str = "DeepSpeed config") -> None:
    """Refuse sections of the wrong type that the policy and `doctor` read, as DeepSpeed itself would refuse them.

    Reading `"offload_param": "cpu"` as "no offload", or `"enabled": "false"` as true, would explain a launch that
    DeepSpeed then rejects or runs differently; the message names the section, the value and what is accepted.
    """
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise LoadPolicyError(f"{source}: `zero_optimization` must be an object, got {zero!r}.")
    for key in ("offload_param", "offload_optimizer"):
        section = zero.get(key)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise LoadPolicyError(
                f'{source}: `zero_optimization.{key}` must be an object such as {{"device": "cpu"}}, got {section!r}.'
            )
        device = section.get("device", "none")
        if device not in OFFLOAD_DEVICES:
            raise LoadPolicyError(
                f"{source}: `zero_optimization.{key}.device` is {device!r}; accepted: "
                f"{', '.join(map(repr, OFFLOAD_DEVICES))}."
            )
    hpz = zero.get("zero_hpz_partition_size", 1)
    if isinstance(hpz, bool) or not isinstance(hpz, int) or hpz < 1:
        raise LoadPolicyError(
            f"{source}: `zero_optimization.zero_hpz_partition_size` must be an integer >= 1, got {hpz!r}."
        )
    _require_bool(zero, "zero_quantized_nontrainable_weights", f"{source}: `zero_optimization.")
    autoep = config.get("expert_parallel", {})
    if not isinstance(autoep, dict):
        raise LoadPolicyError(
            f'{source}: `expert_parallel` must be an object such as {{"enabled": true}}, got {autoep!r}.'
        )
    _require_bool(autoep, "enabled", f"{source}: `expert_parallel.")


def _require_bool(section: dict[str, object], key: str, where: str) -> None:
    value = section.get(key, False)
    if not isinstance(value, bool):
        raise LoadPolicyError(f"{where}{key}` must be true or false (a JSON boolean), got {value!r}.")


def keeps_flat_partitions(config: dict[str, object]) -> bool:
    """Whether ZeRO-3 keeps each rank's share of a parameter as one flat slice in `ds_tensor`, and nothing else.

    Mirrors transformers' `zero3_keeps_flat_partitions` (partition reads): hpZ (`zero_hpz_partition_size > 1`) also
    keeps a secondary partition, NVMe parameter offload keeps the partition in a swap file, and quantized non-trainable
    weights store it quantized. Partition reads write only the flat slice, so those configs gather and copy.
    """
    zero = config.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        return False
    offload = zero.get("offload_param") or {}
    return (
        zero.get("zero_hpz_partition_size") in (None, 1)
        and not (isinstance(offload, dict) and offload.get("device") == "nvme")
        and not zero.get("zero_quantized_nontrainable_weights", False)
    )


def read_zero_stage(path: Path) -> int:
    """The ZeRO stage of the DeepSpeed config file at `path`, with a clear error for a missing or broken file."""
    return zero_stage_of(read_config(path), source=f"DeepSpeed config {str(path)!r}")


def read_config(path: Path) -> dict[str, object]:
    """The DeepSpeed config file at `path`, parsed, with a clear error for a missing, broken or non-object file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LoadPolicyError(f"Cannot read DeepSpeed config {str(path)!r}: {exc.strerror or exc}.") from exc
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LoadPolicyError(
            f"DeepSpeed config {str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}."
        ) from exc
    if not isinstance(config, dict):
        raise LoadPolicyError(
            f"DeepSpeed config {str(path)!r}: expected a JSON object at the top level, got {type(config).__name__}."
        )
    return config
