"""What a worker sets up before its body, written once: the ZeRO-3 config its launch trains or loads with, and the
holder that shows it to `from_pretrained`. The device and the process group on it are `harness.device`'s; the
resident peak before a measured phase is `procfs.reset_resident_peak`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def zero3_config(
    world: int, *, micro_batch: int = 1, zero: Mapping[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    """DeepSpeed's config for ZeRO-3 over `world` ranks, `micro_batch` rows per rank and step (no accumulation):
    `zero` adds to its `zero_optimization` section, `extra` to the config itself."""
    return {
        "zero_optimization": {"stage": 3, **(zero or {})},
        "train_batch_size": micro_batch * world,
        "train_micro_batch_size_per_gpu": micro_batch,
        **extra,
    }


def show_zero3(config: Mapping[str, Any]) -> Any:
    """transformers' `HfDeepSpeedConfig` for `config`: `from_pretrained` sees ZeRO-3 through a weak reference to it,
    so the caller holds what this returns for as long as it loads."""
    from transformers.integrations.deepspeed import HfDeepSpeedConfig  # noqa: PLC0415  # the tree under test's

    return HfDeepSpeedConfig(config)
