"""The loading cost model: what `from_pretrained` reads and holds on each rank, per policy, from an inventory alone.

Pure: from an `Inventory` and a `Launch`, each rank class's bytes read, host (anonymous, file-backed) and device peaks,
and what it holds, each with its reason, following what transformers 5.23.0 and the series do phase by phase. Figures
exclude the baseline (host peaks add it back); on a CPU launch device memory counts as host anonymous memory. The
phases and the calibration: docs/scaling.md.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass

from loadpolicy.plan.inventory import Inventory, TensorEntry
from loadpolicy.policy import DenseWeights, LoadingBranch, LoadPolicyError, PolicyName
from loadpolicy.shape import LaunchShape


class Device(enum.StrEnum):
    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class Launch:
    """A launch as the user writes it (`shape`), on CPU or GPU ranks; what it loads with is the selector's answer."""

    shape: LaunchShape
    device: Device = Device.CPU
    # The checkpoint stores one key per expert (the format of the hub's Qwen3-MoE, Mixtral, DeepSeek-V3): loading
    # stacks them into the model's fused expert tensors.
    per_expert_keys: bool = True

    @property
    def policy(self) -> PolicyName:
        return self.shape.selected().name

    @property
    def ranks(self) -> int:
        return self.shape.ranks

    @property
    def ep(self) -> int:
        return self.shape.ep

    @property
    def tp(self) -> int:
        """Ranks a dense tensor is split over at load time: the TP plan's, unless the policy leaves them to ZeRO-3."""
        if self.shape.selected().dense_weights is DenseWeights.LEFT_TO_ZERO3:
            return 1
        return self.shape.parallel_sizes().tp

    @property
    def under_zero3(self) -> bool:
        return self.shape.zero3

    @property
    def dp(self) -> int:
        return self.ranks // self.ep


@dataclass(frozen=True, slots=True)
class Figure:
    nbytes: int
    why: str


@dataclass(frozen=True, slots=True)
class RankCost:
    """One class of ranks that behave alike (rank 0 differs from the rest under Zero3Init)."""

    ranks: str
    read: Figure  # checkpoint bytes this rank reads (maps and touches)
    peak_anon: Figure  # host anonymous memory at its peak (includes device memory on a CPU launch)
    peak_file: Figure  # file-backed checkpoint pages mapped at the peak
    peak_device: Figure  # accelerator memory at its peak (0 on a CPU launch)
    held: Figure  # the bytes of the tensors the rank holds when from_pretrained returns
    resident: Figure  # host RSS above the baseline then, once every tensor has been touched
    held_after_deepspeed: Figure | None  # after deepspeed.initialize partitions it (None: no DeepSpeed)

    def peak_host(self, baseline: int) -> int:
        return baseline + self.peak_anon.nbytes + self.peak_file.nbytes


@dataclass(frozen=True, slots=True)
class Plan:
    launch: Launch
    inventory: Inventory
    ranks: tuple[RankCost, ...]

    def bottleneck(self, baseline: int = 0) -> RankCost:
        """The rank class with the largest host peak (ties: the most read)."""
        return max(self.ranks, key=lambda r: (r.peak_host(baseline), r.peak_device.nbytes, r.read.nbytes))


def check_launch(launch: Launch, inventory: Inventory) -> None:
    """Refuse shapes the selector refuses (its own error), and shapes this model cannot cost, naming the value."""
    launch.shape.selected()
    if launch.ep > 1 and (inventory.num_experts == 0 or inventory.num_experts % launch.ep):
        raise LoadPolicyError(
            f"ep={launch.ep} must divide the number of experts ({inventory.num_experts}) of {inventory.model_type}"
        )
    if launch.tp not in (1, launch.ranks):
        raise LoadPolicyError(
            f"{launch.policy}'s TP mesh covers every rank in transformers 5.23.0: tp must be 1 or ranks "
            f"({launch.ranks}), got {launch.tp} (dp={launch.dp} replicas without ZeRO-3 are not modelled)"
        )


def _local(entry: TensorEntry, launch: Launch) -> int:
    if entry.expert:
        return entry.nbytes // launch.ep
    return entry.nbytes // launch.tp if entry.tp_split else entry.nbytes


def _largest_module(inventory: Inventory, ep: int = 1) -> tuple[int, str]:
    """The module whose own parameters are the largest whole; with `ep`, an expert module holds its 1/ep."""
    per_module: dict[str, int] = defaultdict(int)
    for entry in inventory.entries:
        per_module[entry.module] += entry.nbytes // ep if entry.expert else entry.nbytes
    name = max(per_module, key=lambda m: per_module[m])
    return per_module[name], name


def _largest_fused(inventory: Inventory) -> TensorEntry | None:
    fused = [e for e in inventory.entries if e.fused_experts]
    return max(fused, key=lambda e: e.nbytes) if fused else None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.2f} GiB"


def _zero3_init(launch: Launch, inventory: Inventory) -> tuple[RankCost, ...]:
    total, world = inventory.total_bytes, launch.ranks
    partition = total // world
    gathered, module = _largest_module(inventory)
    fused = _largest_fused(inventory)
    # Stacking a layer's per-expert tensors, then concatenating gate and up: two copies of the merged group.
    merge = 2 * fused.nbytes if fused is not None and launch.per_expert_keys else 0
    on_device = launch.device is Device.GPU
    model = Figure(
        partition + gathered,
        f"1/{world} partition of every tensor ({_gib(partition)}) plus the largest module gathered whole while "
        f"rank 0 copies it in ({module}: {_gib(gathered)})",
    )
    held = Figure(partition, f"1/{world} ZeRO-3 partition of all {_gib(total)}")
    merge_why = f"merging one layer's experts on the host: 2 x {_gib(fused.nbytes)}" if merge and fused else ""
    rank0_anon = Figure(
        (0 if on_device else model.nbytes) + merge,
        "; ".join(why for why in ("" if on_device else model.why, merge_why) if why) or "nothing",
    )
    zero = Figure(0, "no device on a CPU launch")
    rank0 = RankCost(
        ranks="0",
        read=Figure(total, "the whole checkpoint: only rank 0 reads values under the ZeRO-3 loader"),
        peak_anon=rank0_anon,
        peak_file=Figure(total, "the whole checkpoint stays mapped until loading ends"),
        peak_device=model if on_device else zero,
        held=held,
        resident=Figure(0 if on_device else partition, "the partition" if not on_device else "nothing on the host"),
        held_after_deepspeed=held,
    )
    if world == 1:
        return (rank0,)
    rest = RankCost(
        ranks=f"1-{world - 1}",
        read=Figure(0, "headers only (map_location='meta')"),
        peak_anon=Figure(0, "nothing: its partition is on the device") if on_device else model,
        peak_file=Figure(0, "nothing mapped"),
        peak_device=model if on_device else zero,
        held=held,
        resident=rank0.resident,
        held_after_deepspeed=held,
    )
    return rank0, rest


def _read_partitions(launch: Launch, inventory: Inventory) -> tuple[RankCost, ...]:
    # Under EPMeta each rank's experts (1/ep) are partitioned over the world / ep ranks that hold them: 1/world too.
    total, world = inventory.total_bytes, launch.ranks
    partition = total // world
    built, module = _largest_module(inventory, launch.ep)
    largest = max(inventory.entries, key=lambda e: e.nbytes // launch.ep if e.expert else e.nbytes)
    held = Figure(partition, f"1/{world} ZeRO-3 partition of all {_gib(total)}")
    builder = "zero.Init builds" if launch.ep == 1 else "partitioning the meta model allocates"
    build = f"{builder} the largest module whole before partitioning it ({module}: {_gib(built)})"
    if launch.device is Device.GPU:
        # a range is read into a host tensor, then copied to the device partition
        anon = Figure(largest.nbytes // world, f"reading 1/{world} of {largest.name} on the host")
        device = Figure(partition + built, f"{held.why}; {build}")
        resident = Figure(0, "nothing on the host")
    else:
        # ranges are read straight into the partition: no buffer beside it. Without zero.Init's broadcast (the
        # fork's build) nothing writes the whole module the build allocates, so none of its pages become resident.
        anon = Figure(partition, f"{held.why}; {build}, but never writes it (no broadcast): none of it resident")
        device = Figure(0, "no device on a CPU launch")
        resident = Figure(partition, "the partition")
    read = Figure(partition, f"its 1/{world} of every tensor, each range one read of exactly its bytes")
    nothing_mapped = Figure(0, "nothing mapped: ranges are read, not memory-mapped")
    return (RankCost("all", read, anon, nothing_mapped, device, held, resident, held),)


def _shard_on_read(launch: Launch, inventory: Inventory) -> tuple[RankCost, ...]:
    owned = sum(_local(e, launch) for e in inventory.entries)
    experts = sum(_local(e, launch) for e in inventory.entries if e.expert)
    dense = owned - experts
    # Merged per-expert keys and TP slices are copied out of the mapping; whole tensors stay views of it.
    copied = sum(_local(e, launch) for e in inventory.entries if _copied(e, launch))
    fused = _largest_fused(inventory)
    # Stacking a layer's gate and up pieces, then concatenating them: the pieces and the result coexist, one local
    # gate_up shard beyond what the rank keeps.
    stack = fused.nbytes // launch.ep if fused is not None and launch.per_expert_keys else 0
    split = f"dense {_gib(dense)}" + (f" (TP 1/{launch.tp} where the TP plan splits)" if launch.tp > 1 else "")
    owned_why = f"{split} + experts {_gib(experts)}" + (f" (1/{launch.ep} by EP)" if launch.ep > 1 else "")
    read = Figure(owned, f"only what it keeps: {owned_why}")
    mapped = Figure(owned, "every page it read stays mapped while any loaded tensor is still a view of the file")
    held = Figure(owned, owned_why)
    why_stack = f"; merging one layer's local experts: {_gib(stack)}" if stack else ""
    if launch.device is Device.GPU:
        anon = Figure(0, "tensors go to the device as they are read")
        device = Figure(owned + stack, owned_why + why_stack)
        resident = Figure(0, "nothing: the files are closed and every tensor is on the device")
    else:
        copies = f"copies of merged experts and TP slices: {_gib(copied)}; whole tensors stay file-backed views"
        anon = Figure(copied + stack, copies + why_stack)
        device = Figure(0, "no device on a CPU launch")
        resident = Figure(copied + owned, "the copies, and the mapped pages they and the views came from")
    after = (
        Figure(inventory.total_bytes // launch.ranks, f"ZeRO-3 partitions everything over {launch.ranks} ranks")
        if launch.under_zero3
        else None
    )
    return (RankCost("all", read, anon, mapped, device, held, resident, after),)


def _copied(entry: TensorEntry, launch: Launch) -> bool:
    return (entry.expert and (launch.per_expert_keys or launch.ep > 1)) or (entry.tp_split and launch.tp > 1)


def predict(launch: Launch, inventory: Inventory) -> Plan:
    """Per-rank figures for loading `inventory` with `launch`: read, peaks, held, with the reason for each."""
    check_launch(launch, inventory)
    cost_of = _COST_OF_BRANCH[launch.shape.selected().loading_branch]
    return Plan(launch, inventory, cost_of(launch, inventory))


_COST_OF_BRANCH = {
    LoadingBranch.ZERO3_GATHER_AND_COPY: _zero3_init,
    LoadingBranch.ZERO3_READ_PARTITIONS: _read_partitions,
    LoadingBranch.SHARD_ON_READ: _shard_on_read,
}
