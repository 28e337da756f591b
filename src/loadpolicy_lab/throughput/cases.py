"""The throughput comparison's ways of training an MoE: which tree, the policy its ranks must report, its launch."""

from __future__ import annotations

import enum

from loadpolicy.shape import LaunchShape
from loadpolicy_lab.harness.launch import Tree


class Way(enum.StrEnum):
    """In launch order: plain ZeRO-3 first (the reference of the first-loss check, and the way that holds the most
    memory)."""

    ZERO3 = "zero3"  # stock dense ZeRO-3, no EP
    DISPATCH = "dispatch"  # EPMeta, token dispatch: DistributedConfig(fsdp_size=W, ep_size=E)
    TP_EP = "tp_ep"  # EPMeta, DistributedConfig(tp_size=E, ep_size=E)
    AUTOEP = "autoep"  # DeepSpeed AutoEP on the stock tree: experts swapped in deepspeed.initialize

    @property
    def tree(self) -> Tree:
        return Tree.PATCHED if self in (Way.DISPATCH, Way.TP_EP) else Tree.STOCK

    @property
    def policy(self) -> str | None:
        """The policy every rank must report (None on stock, which has none)."""
        return "EPMeta" if self.tree is Tree.PATCHED else None

    def shape(self, ranks: int, ep: int) -> LaunchShape:
        """AutoEP and plain ZeRO-3 load with no `DistributedConfig` (AutoEP's EP size is its `autoep_size`)."""
        if self is Way.DISPATCH:
            return LaunchShape.dispatching(ranks, ep, zero3=True)
        if self is Way.TP_EP:
            return LaunchShape.experts_over(ranks, ep, zero3=True)
        return LaunchShape(ranks, zero3=True)


# train what `zero3` trains: every rank its own micro-batch of one global batch
SAME_DATA = (Way.DISPATCH, Way.AUTOEP)
