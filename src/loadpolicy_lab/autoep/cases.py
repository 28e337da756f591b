"""The AutoEP comparison's cases: the architectures, the launch (world = dp x ep), and the two ways compared."""

from __future__ import annotations

import enum
from typing import Any

from loadpolicy_lab.harness.launch import Tree


ARCHS = ("qwen3_moe", "mixtral")
WORLD, DP = 4, 2  # ep = WORLD // DP = 2
STEPS = 5
MIB = 1024**2


def expert_parallel_section(arch: str, ep: int) -> dict[str, Any]:
    """AutoEP's config section (`module_inject/auto_ep_config.py`) for model type `arch`, experts over `ep` ranks."""
    return {
        "enabled": True,
        "autoep_size": ep,
        "preset_model": arch,  # the presets are named like the HF model types they cover
        # CPU: torch._grouped_mm's path applies the expert activation with a Triton kernel; the per-expert loop is
        # the path that runs in plain PyTorch.
        "use_grouped_mm": False,
    }


class Way(enum.StrEnum):
    EPMETA = "epmeta"
    AUTOEP = "autoep"

    @property
    def tree(self) -> Tree:
        return Tree.PATCHED if self is Way.EPMETA else Tree.STOCK

    @property
    def label(self) -> str:
        return "EPMeta (patched tree)" if self is Way.EPMETA else "AutoEP (stock tree + shim)"
