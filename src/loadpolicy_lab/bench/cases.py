"""The load benchmark's cases: each way of loading, the policy and loading branch its ranks must report, and what
makes a launch not that case."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadpolicy.policy import LoadingBranch, PolicyName
from loadpolicy.shape import EPLayout, LaunchShape
from loadpolicy_lab.bench.contract import BenchSpec
from loadpolicy_lab.harness.launch import Tree


@dataclass(frozen=True, slots=True)
class Case:
    """One way of loading: which policy the ranks must report, and the inputs that select it."""

    label: str
    policy: PolicyName
    zero3: bool
    layout: EPLayout = EPLayout.NONE
    requested: PolicyName | None = None
    moe_only: bool = False
    dense_only: bool = False
    # stock 5.23.0 for what stock does: the patched tree's loads add store exchanges (agreement, fail-together)
    tree: Tree = Tree.PATCHED
    # the loader every rank must report, where the policy has more than one
    branch: LoadingBranch | None = None
    # DeepSpeed AutoEP: a stock `zero.Init` load whose experts `deepspeed.initialize` regroups over the ranks
    autoep: bool = False

    def shape(self, ranks: int) -> LaunchShape:
        """EP over every rank (`DistributedConfig(tp_size=R, ep_size=R)`) where the case uses EP."""
        stock = self.tree is Tree.STOCK  # stock transformers gathers and copies
        return LaunchShape(ranks, self.zero3, self.layout, requested=self.requested, flat_partitions=not stock)

    def spec(
        self, ranks: int, checkpoint: Path, model_class: str, fingerprints: Path, logits: Path | None = None
    ) -> BenchSpec:
        """What every rank of this case's load of `checkpoint` is handed; `logits`: judge its forward too."""
        return {
            "policy": self.policy,
            "zero3": self.zero3,
            "distributed": self.shape(ranks).distributed_config(),
            "requested": self.requested,
            "checkpoint": str(checkpoint),
            "model_class": model_class,
            "fingerprints": str(fingerprints),
            "logits": None if logits is None else str(logits),
            "autoep": self.autoep,
        }


_MSOR, _EP = PolicyName.META_SHARD_ON_READ, EPLayout.TP_EQUALS_EP
CASES = (
    Case("Zero3Init (stock)", PolicyName.ZERO3_INIT, zero3=True, tree=Tree.STOCK),
    Case("Zero3Init: partition reads", PolicyName.ZERO3_INIT, zero3=True, branch=LoadingBranch.ZERO3_READ_PARTITIONS),
    Case("MetaShardOnRead: plain EP", _MSOR, zero3=False, layout=_EP, moe_only=True),
    Case("MetaShardOnRead: dense ZeRO-3", _MSOR, zero3=True, requested=_MSOR, dense_only=True),
    Case(
        "EPMeta: partition reads",
        PolicyName.EP_META,
        zero3=True,
        layout=_EP,
        moe_only=True,
        branch=LoadingBranch.ZERO3_READ_PARTITIONS,
    ),
)
