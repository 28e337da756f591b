"""One launch as a user writes it: ranks, ZeRO-3 on or off, how EP is spelled, and an explicit policy choice.

Every feature that starts or predicts a launch (the load matrix, faults, parity, the benchmark, AutoEP, `plan`)
describes it with a `LaunchShape`; the `DistributedConfig` a rank passes and the selector's inputs both derive from it,
so the spelling of a shape lives here once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from loadpolicy.policy import LoadInputs, LoadPolicy, LoadPolicyError, ParallelSizes, PolicyName, select_load_policy


__all__ = ["EPLayout", "LaunchShape"]


class EPLayout(enum.StrEnum):
    """How the launch asks for expert parallelism in its `DistributedConfig`."""

    # no DistributedConfig at all
    NONE = "none"
    # DistributedConfig(tp_size=ep, ep_size=ep[, dp_replicate_size=dp]): the shape transformers 5.23.0 accepts
    TP_EQUALS_EP = "tp=ep"
    # DistributedConfig(fsdp_size=ranks, ep_size=ep): token dispatch, every rank its own batch and tokens sent to
    # their experts by all-to-all; the fsdp ranks are FSDP2's without ZeRO-3 and ZeRO-3's under it
    TOKEN_DISPATCH = "fsdp=world"
    # DistributedConfig(fsdp_size=ranks) without EP: FSDP2 alone, refused under ZeRO-3
    FSDP_WITHOUT_EP = "fsdp, no ep"
    # DistributedConfig(enable_expert_parallel=True): the deprecated flag, which leaves ep_size at 1
    DEPRECATED_FLAG = "enable_expert_parallel"


@dataclass(frozen=True, slots=True)
class LaunchShape:
    """`ranks` processes; with EP, groups of `group` ranks (default: all) that split the experts, `dp` replicas."""

    ranks: int
    zero3: bool
    layout: EPLayout = EPLayout.NONE
    group: int | None = None
    requested: PolicyName | None = None
    quantized: bool = False
    # ZeRO-3 keeps flat partitions (no hpZ, NVMe parameter offload, quantized weights) and transformers reads them;
    # False: stock transformers, or such a DeepSpeed config: dense ZeRO-3 gathers and copies
    flat_partitions: bool = True

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise LoadPolicyError(f"ranks must be >= 1, got {self.ranks}")
        if self.group is not None and self.layout not in (EPLayout.TP_EQUALS_EP, EPLayout.TOKEN_DISPATCH):
            raise LoadPolicyError(f"an EP group of {self.group} ranks needs EP; the layout is {self.layout!s}")
        if self.group is not None and not (1 <= self.group <= self.ranks and self.ranks % self.group == 0):
            raise LoadPolicyError(f"ep={self.group} must divide ranks={self.ranks} (accepted: a divisor of it)")
        if self.group == self.ranks:  # one spelling per shape: a group of every rank is the default
            object.__setattr__(self, "group", None)

    @classmethod
    def experts_over(
        cls, ranks: int, ep: int, *, zero3: bool, requested: PolicyName | None = None, quantized: bool = False
    ) -> LaunchShape:
        """EP as 5.23.0 spells it: `DistributedConfig(tp_size=ep, ep_size=ep[, dp_replicate_size=ranks // ep])`;
        `ep=1` is no distributed config at all."""
        layout = EPLayout.NONE if ep == 1 else EPLayout.TP_EQUALS_EP
        group = None if ep == 1 else ep
        return cls(ranks, zero3, layout, group=group, requested=requested, quantized=quantized)

    @classmethod
    def dispatching(cls, ranks: int, ep: int, *, zero3: bool, requested: PolicyName | None = None) -> LaunchShape:
        """Token dispatch: `DistributedConfig(fsdp_size=ranks, ep_size=ep)`, every rank its own batch."""
        return cls(ranks, zero3, EPLayout.TOKEN_DISPATCH, group=ep, requested=requested)

    @property
    def ep(self) -> int:
        """Ranks each expert is split over (1 without EP)."""
        if self.layout not in (EPLayout.TP_EQUALS_EP, EPLayout.TOKEN_DISPATCH):
            return 1
        return self.ranks if self.group is None else self.group

    @property
    def dp(self) -> int:
        """Data-parallel replicas of the EP group (world = dp x ep): ranks that hold the same experts."""
        return self.ranks // self.ep

    @property
    def batches(self) -> int:
        """Distinct micro-batches per step: one per replica when the ranks of an EP group share one (tp = ep), one
        per rank with token dispatch."""
        return self.ranks if self.layout is EPLayout.TOKEN_DISPATCH else self.dp

    def distributed_config(self) -> dict[str, int | bool] | None:
        """The `DistributedConfig(**...)` keyword arguments every rank passes, or None for none."""
        match self.layout:
            case EPLayout.NONE:
                return None
            case EPLayout.TP_EQUALS_EP:
                replicas = {"dp_replicate_size": self.dp} if self.dp > 1 else {}
                return {"tp_size": self.ep, "ep_size": self.ep} | replicas
            case EPLayout.TOKEN_DISPATCH:
                return {"fsdp_size": self.ranks, "ep_size": self.ep}
            case EPLayout.FSDP_WITHOUT_EP:
                return {"fsdp_size": self.ranks}
            case EPLayout.DEPRECATED_FLAG:
                return {"enable_expert_parallel": True}

    def expert_parallel_config(self) -> dict[str, int | bool]:
        """`distributed_config()` of a shape that shards experts; a shape without EP is an error naming its layout."""
        sizes = self.distributed_config()
        if sizes is None or self.layout not in (EPLayout.TP_EQUALS_EP, EPLayout.TOKEN_DISPATCH):
            raise ValueError(f"layout {self.layout} does not shard experts; accepted: tp = ep, token dispatch")
        return sizes

    def parallel_sizes(self) -> ParallelSizes:
        """The sizes after transformers' normalisation of `distributed_config()`."""
        match self.layout:
            case EPLayout.TP_EQUALS_EP:
                return ParallelSizes(tp=self.ep, ep=self.ep, dp_replicate=self.dp)
            case EPLayout.TOKEN_DISPATCH:
                return ParallelSizes(fsdp=self.ranks, ep=self.ep)
            case EPLayout.FSDP_WITHOUT_EP:
                return ParallelSizes(fsdp=self.ranks)
            case EPLayout.NONE | EPLayout.DEPRECATED_FLAG:
                return ParallelSizes()

    def load_inputs(self) -> LoadInputs:
        return LoadInputs(
            zero3_enabled=self.zero3,
            quantized=self.quantized,
            zero3_flat_partitions=self.zero3 and self.flat_partitions,
            sizes=self.parallel_sizes(),
            requested=self.requested,
        )

    def selected(self) -> LoadPolicy:
        """The policy the selector picks for this shape; `LoadPolicyError` when it refuses it."""
        return select_load_policy(self.load_inputs())

    def describe(self) -> str:
        requested = f", requested {self.requested}" if self.requested else ""
        zero3 = "ZeRO-3" if self.zero3 else "no ZeRO-3"
        return f"{self.ranks} ranks, {zero3}, EP {self.layout} (ep={self.ep}, dp={self.dp}){requested}"
