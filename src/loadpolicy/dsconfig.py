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


def keeps_flat_partitions(config: dict[str, object]) -> bool:
    """Whether ZeRO-3 keeps each rank's share of a parameter as one flat slice in `ds_tensor`, and nothing else.

    Mirrors transformers' `zero3_keeps_flat_partitions` (patch 0022): hpZ (`zero_hpz_partition_size > 1`) also keeps
    a secondary partition, NVMe parameter offload keeps the partition in a swap file, and quantized non-trainable
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
