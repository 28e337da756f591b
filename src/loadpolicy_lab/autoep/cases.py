"""The AutoEP comparison's cases: the architectures, the launch (world = dp x ep), and the two ways compared."""

from __future__ import annotations

import enum

from loadpolicy_lab.harness.launch import Tree


ARCHS = ("qwen3_moe", "mixtral")
WORLD, DP = 4, 2  # ep = WORLD // DP = 2
STEPS = 5
MIB = 1024**2


class Way(enum.StrEnum):
    EPMETA = "epmeta"
    AUTOEP = "autoep"

    @property
    def tree(self) -> Tree:
        return Tree.PATCHED if self is Way.EPMETA else Tree.STOCK

    @property
    def label(self) -> str:
        return "EPMeta (patched tree)" if self is Way.EPMETA else "AutoEP (stock tree + shim)"
