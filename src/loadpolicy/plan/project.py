"""Projection: the published MoE models on 4 to 64 GPU ranks under every policy, from the calibrated cost model.

Launch shapes are the ones users run: Zero3Init is stock dense ZeRO-3 over every rank; MetaShardOnRead is plain EP
as transformers 5.23.0 spells it (`DistributedConfig(tp_size=R, ep_size=R)`, no DeepSpeed); EPMeta is EP within a
node of 8 GPUs (ep = min(R, 8)) with ZeRO-3 over the data-parallel replicas (world = dp x ep), or EP over every rank,
reading partitions; and, for comparison, as it loads where partitions cannot be read (dense weights whole).
Figures are per rank, above the baseline of an idle process, for the bottleneck rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from loadpolicy.plan.configs import published_config
from loadpolicy.plan.cost import Device, Launch, Plan, predict
from loadpolicy.plan.inventory import Inventory, inventory_from_config
from loadpolicy.shape import LaunchShape
from loadpolicy.units import GIB


GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True)
class ProjectionRow:
    model: str
    parameters: int
    policy: str
    ranks: int
    ep: int
    tp: int
    bottleneck: str
    read_gib: float
    peak_host_gib: float
    peak_host_file_gib: float
    peak_device_gib: float
    held_gib: float
    held_after_deepspeed_gib: float | None
    # the host of rank 0 (its min(R, GPUS_PER_NODE) ranks): their anonymous memory, plus the checkpoint pages they
    # map, counted once (the page cache is shared) and at most the checkpoint
    peak_node_host_gib: float = 0.0

    @property
    def fits_80gb_gpu(self) -> bool:
        """The peak on the device within an 80 GB GPU (74.5 GiB)."""
        return self.peak_device_gib <= 80e9 / GIB


def _zero3_init(ranks: int) -> Launch:
    return Launch(LaunchShape(ranks, zero3=True, flat_partitions=False), Device.GPU)


def _partition_reads(ranks: int) -> Launch:
    return Launch(LaunchShape(ranks, zero3=True), Device.GPU)


def _plain_ep(ranks: int) -> Launch:
    return Launch(LaunchShape.experts_over(ranks, ranks, zero3=False), Device.GPU)


def _ep_meta_node(ranks: int) -> Launch:
    return Launch(LaunchShape.experts_over(ranks, min(ranks, GPUS_PER_NODE), zero3=True), Device.GPU)


def _ep_meta_world(ranks: int) -> Launch:
    return Launch(LaunchShape.experts_over(ranks, ranks, zero3=True), Device.GPU)


def _ep_meta_node_dense_whole(ranks: int) -> Launch:
    """EPMeta where partitions cannot be read (PR #45548's shape): dense weights whole until `deepspeed.initialize`."""
    shape = LaunchShape.experts_over(ranks, min(ranks, GPUS_PER_NODE), zero3=True)
    return Launch(replace(shape, flat_partitions=False), Device.GPU)


# (label, launch shape at R ranks): the shapes users run.
SHAPES: tuple[tuple[str, Callable[[int], Launch]], ...] = (
    ("Zero3Init (stock)", _zero3_init),
    ("Zero3Init: partition reads", _partition_reads),
    ("MetaShardOnRead (plain EP, tp = ep = R)", _plain_ep),
    (f"EPMeta (ep = min(R, {GPUS_PER_NODE}), dp = R / ep)", _ep_meta_node),
    (f"EPMeta, dense read whole (ep = min(R, {GPUS_PER_NODE}))", _ep_meta_node_dense_whole),
    ("EPMeta (ep = R)", _ep_meta_world),
)


def project_inventory(name: str, inventory: Inventory, ranks: tuple[int, ...]) -> list[ProjectionRow]:
    rows = []
    for label, launch_for in SHAPES:
        for count in ranks:
            plan = predict(launch_for(count), inventory)
            cost = plan.bottleneck()
            node = _node_host_bytes(plan, min(count, GPUS_PER_NODE), inventory.total_bytes)
            after = cost.held_after_deepspeed
            rows.append(
                ProjectionRow(
                    model=name,
                    parameters=inventory.parameters,
                    policy=label,
                    ranks=count,
                    ep=plan.launch.ep,
                    tp=plan.launch.tp,
                    bottleneck=cost.ranks,
                    read_gib=cost.read.nbytes / GIB,
                    peak_host_gib=cost.peak_host(0) / GIB,
                    peak_host_file_gib=cost.peak_file.nbytes / GIB,
                    peak_device_gib=cost.peak_device.nbytes / GIB,
                    held_gib=cost.held.nbytes / GIB,
                    held_after_deepspeed_gib=None if after is None else after.nbytes / GIB,
                    peak_node_host_gib=node / GIB,
                )
            )
    return rows


def _node_host_bytes(plan: Plan, node_ranks: int, checkpoint: int) -> int:
    """Host peak of the node that holds rank 0: its ranks' anonymous peaks, and their mapped pages once."""
    by_class = {cost.ranks: cost for cost in plan.ranks}
    if "all" in by_class:
        members = [by_class["all"]] * node_ranks
    else:  # rank 0 and the class of the others
        rest = next(cost for name, cost in by_class.items() if name != "0")
        members = [by_class["0"], *[rest] * (node_ranks - 1)]
    anonymous = sum(cost.peak_anon.nbytes for cost in members)
    return anonymous + min(checkpoint, sum(cost.peak_file.nbytes for cost in members))


def project(models: tuple[str, ...], ranks: tuple[int, ...]) -> list[ProjectionRow]:
    rows = []
    for name in models:
        rows += project_inventory(name, inventory_from_config(published_config(name)), ranks)
    return rows


def render_projection(rows: list[ProjectionRow]) -> str:
    lines = [
        "| model | policy | ranks | ep x tp | bottleneck rank | reads GiB | peak host GiB (file-backed) "
        "| peak host GiB, rank 0's node | peak GPU GiB | fits an 80 GB GPU | held GiB "
        "| after deepspeed.initialize GiB |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        after = "-" if r.held_after_deepspeed_gib is None else f"{r.held_after_deepspeed_gib:.2f}"
        lines.append(
            f"| {r.model} ({r.parameters / 1e9:.0f}B) | {r.policy} | {r.ranks} | {r.ep} x {r.tp} | {r.bottleneck} "
            f"| {r.read_gib:.1f} | {r.peak_host_gib:.1f} ({r.peak_host_file_gib:.1f}) | {r.peak_node_host_gib:.1f} "
            f"| {r.peak_device_gib:.1f} | {'yes' if r.fits_80gb_gpu else 'no'} | {r.held_gib:.1f} | {after} |"
        )
    return "\n".join(lines)


def plot_projection(rows: list[ProjectionRow], path: Path) -> None:
    import matplotlib  # noqa: PLC0415  # only the bench environment installs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    models = list(dict.fromkeys(r.model for r in rows))
    figure, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 8), squeeze=False)
    for column, model in enumerate(models):
        for label, _ in SHAPES:
            points = sorted((r.ranks, r) for r in rows if r.model == model and r.policy == label)
            ranks = [n for n, _ in points]
            axes[0][column].plot(ranks, [r.peak_host_gib for _, r in points], marker="o", label=label)
            axes[1][column].plot(ranks, [r.peak_device_gib for _, r in points], marker="o", label=label)
        axes[0][column].set_title(f"{model}: peak host RSS, bottleneck rank (GiB)")
        axes[1][column].set_title(f"{model}: peak GPU memory per rank (GiB)")
        for axis in (axes[0][column], axes[1][column]):
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("ranks (GPUs)")
            axis.grid(alpha=0.3, which="both")
            axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
