"""The throughput run's judge: every way completed with its policy, and in each round the ways that train the same data
train alike, step by step (`LOSS_BOUND`); speed is reported, never judged.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Literal

from loadpolicy.shape import LaunchShape
from loadpolicy.units import GIB
from loadpolicy_lab.throughput.cases import SAME_DATA, Way
from loadpolicy_lab.throughput.contract import ThroughputRank


LOSS_BOUND = 1e-4


@dataclass(frozen=True, slots=True)
class Row:
    way: str
    ranks: int
    ep: int
    seconds: float  # the whole launch
    error: str | None = None
    repeat: int = 0  # which of `--repeats` interleaved rounds
    problems: list[str] = field(default_factory=list)
    tokens_per_s_per_rank: float | None = None
    step_s: float | None = None  # median over measured steps of the slowest rank's step
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    collectives_s: dict[str, float] = field(default_factory=dict)  # slowest rank, one profiled step
    peak_training_gib: list[float] = field(default_factory=list)  # per rank
    experts_kernel: str = ""  # what computed the experts: transformers' `experts_implementation`, or AutoEP's layers
    first_loss: float | None = None  # mean over ranks
    losses: list[float] = field(default_factory=list)  # mean over ranks, per step (the warm-up first)


def row_of(way: str, shape: LaunchShape, ep: int, seconds: float, results: list[ThroughputRank]) -> Row:
    """One way's figures; `ep` is the way's EP size (AutoEP's `autoep_size`, which its launch shape does not carry)."""
    expected = Way(way).policy
    problems = [
        f"rank {r['rank']} selected {r['policy']}, expected {expected}" for r in results if r["policy"] != expected
    ]
    problems += [
        f"rank {r['rank']} trained {r['distinct_batches']} batches per step, the launch has {shape.batches}"
        for r in results
        if r["distinct_batches"] != shape.batches
    ]
    measured = len(results[0]["steps"])
    slowest = [max(range(len(results)), key=lambda k: results[k]["steps"][s]["total"]) for s in range(measured)]
    step_s = statistics.median(results[k]["steps"][s]["total"] for s, k in enumerate(slowest))

    def part(name: Literal["forward", "backward", "optimizer"]) -> float:
        return statistics.median(results[k]["steps"][s][name] for s, k in enumerate(slowest))

    distinct_tokens = shape.batches * results[0]["tokens_per_step"]
    kinds = sorted({kind for r in results for kind in r["collectives"]})
    return Row(
        way=way,
        ranks=shape.ranks,
        ep=ep,
        seconds=seconds,
        problems=problems,
        tokens_per_s_per_rank=distinct_tokens / shape.ranks / step_s,
        step_s=step_s,
        forward_s=part("forward"),
        backward_s=part("backward"),
        optimizer_s=part("optimizer"),
        collectives_s={kind: max(r["collectives"].get(kind, 0.0) for r in results) for kind in kinds},
        peak_training_gib=[round(r["peak_training_bytes"] / GIB, 2) for r in results],
        experts_kernel=", ".join(sorted({r["experts_kernel"] for r in results})),
        first_loss=statistics.fmean(r["losses"][0] for r in results),
        losses=[statistics.fmean(r["losses"][step] for r in results) for step in range(len(results[0]["losses"]))],
    )


def judge(rows: list[Row]) -> list[str]:
    """Every way completed with its policy; in each round the ways training the same data train alike, step by step."""
    problems = [f"{r.way}: {r.error}" for r in rows if r.error] + [f"{r.way}: {p}" for r in rows for p in r.problems]
    for (repeat, ep), (reference, others) in same_data_rounds(rows).items():
        where = f" (round {repeat + 1}, ep {ep})" if len({r.repeat for r in rows}) > 1 else ""
        if reference is None:
            problems += [f"{r.way}: nothing that trains the same data to compare with{where}" for r in others]
            continue
        for row in others:
            if row.error or reference.error:
                problems.append(f"{row.way}: no losses to compare with {reference.way}'s{where}")
                continue
            worst = worst_loss_difference(row, reference)
            if not (worst <= LOSS_BOUND):
                problems.append(
                    f"{row.way}: losses {_losses(row)} vs {reference.way}'s {_losses(reference)}: relative "
                    f"difference {worst:.1e} > {LOSS_BOUND:.0e}{where}"
                )
    return problems


def same_data_rounds(rows: list[Row]) -> dict[tuple[int, int], tuple[Row | None, list[Row]]]:
    """Per (round, ep): the reference among the ways that train the same data, and the others to judge against it.
    Plain ZeRO-3 (no EP) runs once per round and is every ep's reference in that round."""
    rounds: dict[tuple[int, int], tuple[Row | None, list[Row]]] = {}
    for repeat, ep in sorted({(r.repeat, r.ep) for r in rows if r.way in SAME_DATA}):
        same = [r for r in rows if r.repeat == repeat and r.way in SAME_DATA and r.ep == ep]
        zero3 = next((r for r in rows if r.repeat == repeat and r.way == "zero3"), None)
        if zero3 is not None:
            rounds[(repeat, ep)] = (zero3, same)
        else:
            rounds[(repeat, ep)] = (same[0], same[1:]) if len(same) > 1 else (None, same)
    return rounds


def worst_loss_difference(row: Row, reference: Row) -> float:
    """The largest relative difference of `row`'s losses from `reference`'s, step by step; NaN when either has a NaN
    or they ran a different number of steps."""
    if not row.losses or len(row.losses) != len(reference.losses):
        return float("nan")
    differences = [abs(a - b) / abs(b) for a, b in zip(row.losses, reference.losses, strict=True)]
    return max(differences, key=lambda d: (d != d, d))  # a NaN is the worst, wherever it sits


def _losses(row: Row) -> str:
    return "[" + ", ".join(f"{loss:.6g}" for loss in row.losses) + "]"
