"""The real-width report and its goals, from the rows `perf.widths_run` measured (written by `perf.writer`)."""

from __future__ import annotations

import math

from loadpolicy_lab.perf.cases import PARTITION_READS
from loadpolicy_lab.perf.rows import LIMIT, LIMIT_IN_FLIGHT, LIMIT_KEPT, LIMITS, PEER, PEER_EXPERTS, Row
from loadpolicy_lab.perf.writer import figure


def render_markdown(rows: list[Row], command: str = "", header: bool = True) -> str:
    lines = []
    if header:
        lines += [
            "# Real widths: published MoE shapes, each read every way in the same run",
            "",
            f"`{command}`; CPU gloo, bf16, cold page cache before every launch (`posix_fadvise(DONTNEED)` on every "
            "file). Time: the slowest rank, every rank starting together, until every byte it holds is in memory "
            "(loads: `from_pretrained` and a first touch of every tensor, which reads what a load left mapped); "
            "x limit: over the slowest rank's plain `preadv` of exactly its share (the experts it holds whole, its "
            "ZeRO-3 partition of every other tensor), one read at a time; x in flight: over the same share read "
            "in 16 MiB chunks, 4 `preadv` in flight (as the partition reads keep them); x kept: over that read "
            "into fresh memory, kept (as a load keeps what it reads: the pages it faults in are part of any load's "
            "cost). Peak: the rank whose peak RSS is the largest multiple of T/W (the checkpoint's bytes over the "
            "ranks) plus its RSS before reading. "
            "Values: "
            "loads compare every parameter with the stock one-process load's fingerprints, and their logits on a "
            "fixed prompt (after `deepspeed.initialize`) with the stock one-process forwards': root mean square from "
            "the float32 forward's <= 2x the bf16 one's, and (not judged) the largest difference from the bf16 one; "
            "DCP compares each block with the file's bytes.",
            "",
            "| shape | ranks | way | time s | x limit | x in flight | x kept | peak GiB | T/W + base GiB "
            "| peak / ideal | read/rank GiB | values |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
    by_key = {(r.shape, r.ranks, r.way): r for r in rows}
    for r in rows:
        if r.error:
            lines.append(
                f"| {r.shape} | {r.ranks} | {r.way} | - | - | - | - | - | - | - | - | FAILED: {r.error[:300]} |"
            )
            continue
        over, over_in_flight, over_kept = (_over(r, by_key.get((r.shape, r.ranks, limit))) for limit in LIMITS)
        values = "bytes only" if r.way in LIMITS else f"equal ({r.checked}){_logits(r)}"
        lines.append(
            f"| {r.shape} | {r.ranks} | {r.way} | {figure(r.seconds)} | {figure(over)} | {figure(over_in_flight)} "
            f"| {figure(over_kept)} | {figure(r.peak_gib)} | {figure(r.ideal_gib)} "
            f"| {figure(r.peak_over_ideal, 3)} | {figure(r.read_rank_gib)} | {values} |"
        )
    if header:
        lines += [*_until_trainable_table(rows), "", *goals(rows)]
    return "\n".join(lines) + "\n"


def _until_trainable_table(rows: list[Row]) -> list[str]:
    trainable = [r for r in rows if r.trainable_seconds is not None]
    if not trainable:
        return []
    return [
        "",
        "Until training can start: the ZeRO-3 loads' time with `deepspeed.initialize` (no optimizer; DeepSpeed "
        "AutoEP regroups its experts there), and the peak over both.",
        "",
        "| shape | ranks | way | time s | peak GiB |",
        "|---|---:|---|---:|---:|",
        *(
            f"| {r.shape} | {r.ranks} | {r.way} | {figure(r.trainable_seconds)} | {figure(r.trainable_peak_gib)} |"
            for r in trainable
        ),
    ]


def _logits(row: Row) -> str:
    """The logits' figures beside the values: root mean square from the float32 forward, its bound, and the largest
    difference from the stock bf16 one."""
    if row.logits_not_judged:
        return f"; logits not judged: {row.logits_not_judged}"
    if row.logits_bound is None:
        return ""
    figures = (row.logits_error, row.logits_bound, row.logits_from_one_process, row.logits_half_the_experts)
    error, bound, stock, half = (figure(value, 4) for value in figures)
    return f"; logits {error} <= {bound} (stock bf16 +- {stock}; half the experts: {half})"


def goals(rows: list[Row]) -> list[str]:
    """The partition reads against the goals: within 1.5x the limit, peak <= 1.05x (T/W + baseline), ahead of the
    peer and of stock `zero.Init`; a missing figure is a miss."""
    by_key = {(r.shape, r.ranks, r.way): r for r in rows}
    lines = []
    for r in rows:
        if r.way not in PARTITION_READS:
            continue
        limit, peer = by_key.get((r.shape, r.ranks, LIMIT)), by_key.get((r.shape, r.ranks, PEER))
        peer_experts = by_key.get((r.shape, r.ranks, PEER_EXPERTS))
        stock = by_key.get((r.shape, r.ranks, "Zero3Init (stock)"))
        over = _over(r, limit)
        verdicts = [
            f"{figure(over)}x the limit ({'met' if over <= 1.5 else 'missed'})",
            f"{figure(_over(r, by_key.get((r.shape, r.ranks, LIMIT_IN_FLIGHT))))}x the limit with 4 in flight",
            f"{figure(_over(r, by_key.get((r.shape, r.ranks, LIMIT_KEPT))))}x the limit into memory kept",
            f"peak {figure(r.peak_over_ideal, 3)}x ideal ({'met' if _le(r.peak_over_ideal, 1.05) else 'missed'})",
            f"{figure(_over(peer, r))}x faster than DCP",
            f"{figure(_over(peer_experts, r))}x faster than DCP into the same sharding",
            f"{figure(_over(stock, r))}x faster than stock zero.Init",
        ]
        lines.append(f"- {r.shape} x{r.ranks}, {r.way}: " + "; ".join(verdicts))
    return lines


def _over(row: Row | None, reference: Row | None) -> float:
    """row's seconds over reference's; NaN where either is missing (a NaN meets no goal)."""
    if row is None or reference is None or row.seconds is None or not reference.seconds:
        return math.nan
    return row.seconds / reference.seconds


def _le(value: float | None, bound: float) -> bool:
    return value is not None and value <= bound
