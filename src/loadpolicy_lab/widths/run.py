"""`loadpolicy dev widths`: published MoE shapes at full width, each read every way in the same run.

Per shape and rank count, from a cold page cache each time: the limit (every rank reading exactly its share with plain
`preadv`), each transformers load (`bench.worker`: time, peaks, values against the stock one-process load) and torch
DCP's `HuggingFaceStorageReader`. A load or read whose values are not the checkpoint's, or whose launch fails, fails
the command; the goals (partition reads within 1.5x the limit, peak <= 1.05x (T/W + baseline)) are reported, not
enforced. Writes OUT/widths.md, OUT/widths.json and OUT/widths.png; docs/benchmark.md ("Real widths").
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from loadpolicy.errors import positive_int
from loadpolicy.units import GIB
from loadpolicy_lab.bench.calibrate import render_calibration
from loadpolicy_lab.bench.cases import Case
from loadpolicy_lab.bench.contract import LoadMeasurement
from loadpolicy_lab.bench.run import launch_load, logits_reference_file, reference_file
from loadpolicy_lab.harness.launch import (
    Launched,
    Tree,
    ValidationFailedError,
    add_launch_arguments,
    launch,
    read_results,
)
from loadpolicy_lab.harness.procfs import evict_from_page_cache
from loadpolicy_lab.harness.rank import Contract
from loadpolicy_lab.harness.trees import prebuild_deepspeed_ops, prepare_trees
from loadpolicy_lab.widths.calibrate import calibrate_widths
from loadpolicy_lab.widths.cases import DCP_READERS, LOADS, PARTITION_READS, Reader, has_autoep_preset
from loadpolicy_lab.widths.contract import ReaderMeasurement, ReaderSpec
from loadpolicy_lab.widths.ranges import read_spans
from loadpolicy_lab.widths.shapes import SHAPES, SHAPES_BY_NAME, WidthShape, build


LIMIT = "limit: pread of each rank's share"
LIMIT_IN_FLIGHT = "limit: pread of each rank's share, 4 in flight"
LIMIT_KEPT = "limit: pread of each rank's share, 4 in flight, into memory it keeps"
PEER = "DCP HuggingFaceStorageReader (peer)"
PEER_EXPERTS = "DCP HuggingFaceStorageReader, experts whole on their rank (peer)"
WAY_OF_READER = {
    Reader.PREAD: LIMIT,
    Reader.PREAD_IN_FLIGHT: LIMIT_IN_FLIGHT,
    Reader.PREAD_KEPT: LIMIT_KEPT,
    Reader.DCP: PEER,
    Reader.DCP_EXPERTS: PEER_EXPERTS,
}
LIMITS = (LIMIT, LIMIT_IN_FLIGHT, LIMIT_KEPT)
# the size guard: a checkpoint larger than this (GiB) is refused
MAX_GIB = 8.0


@dataclass(frozen=True, slots=True)
class Row:
    shape: str
    ranks: int
    way: str
    checkpoint_gib: float
    error: str | None = None
    seconds: float | None = None  # the slowest rank
    peak_gib: float | None = None  # the largest per-rank peak RSS
    ideal_gib: float | None = None  # on that rank: T/W + its RSS before reading
    read_rank_gib: float | None = None  # the most one rank read from storage
    checked: int = 0  # parameters (loads) or tensors (DCP) whose values were compared
    # loads, the largest rank's: logits' root mean square from the float32 one-process forward's, and its bound
    # (`bench.logits`); max |logits - the bf16 one-process logits|
    logits_error: float | None = None
    logits_bound: float | None = None
    logits_from_one_process: float | None = None
    logits_half_the_experts: float | None = None  # the reference's: a forward missing half the experts lands there
    logits_not_judged: str | None = None  # why a load's forward did not run (the same on every rank)
    # ZeRO-3 loads: the slowest rank's load, touch and `deepspeed.initialize` (until training can start), and the
    # largest per-rank peak RSS over all three
    trainable_seconds: float | None = None
    trainable_peak_gib: float | None = None
    # CPU of every rank together (user + system): a load's over `from_pretrained`, a reader's over its read
    cpu_seconds: float | None = None
    # patched loads: the slowest rank's seconds in partition reads alone (files opened to the last byte in place),
    # what a reader such as DCP does into tensors allocated beforehand; None where a rank read none
    reading_seconds: float | None = None

    @property
    def peak_over_ideal(self) -> float | None:
        return None if self.peak_gib is None or not self.ideal_gib else self.peak_gib / self.ideal_gib


def _worst(per_rank: list[tuple[float, float]]) -> tuple[float, float]:
    """(peak, ideal) of the rank whose peak is the largest multiple of its ideal."""
    return max(per_rank, key=lambda pair: pair[0] / pair[1])


def load_row(
    shape: str, case: Case, ranks: int, total: int, results: list[LoadMeasurement] | str, **judged: Any
) -> Row:
    """A transformers load's row: its problems (another policy, values not the checkpoint's) fail it."""
    base = Row(shape, ranks, case.label, total / GIB)
    if isinstance(results, str):
        return replace(base, error=results)
    if problems := case.problems(results, judged["tree"], judged["parameters"]):
        return replace(base, error="; ".join(problems)[:400])
    # the fingerprints saw the experts before AutoEP regrouped them: its logits must be judged
    if case.autoep and results[0]["logits_not_judged"]:
        return replace(base, error=f"AutoEP's regrouped experts not judged: {results[0]['logits_not_judged']}")
    peak, ideal = _worst([(max(r["peak_total"], r["held_total"]), total / ranks + r["rss_before"]) for r in results])
    trainable = _until_trainable(results)
    return replace(
        base,
        # until every byte is in memory: a load that maps files reads its pages at first touch
        seconds=max(r["seconds"] + r["touch_seconds"] for r in results),
        peak_gib=peak / GIB,
        ideal_gib=ideal / GIB,
        read_rank_gib=max(r["read_bytes"] for r in results) / GIB,
        checked=min(r["fingerprinted"] for r in results),
        cpu_seconds=_total([r.get("cpu_seconds") for r in results]),
        reading_seconds=_slowest_reading(results),
        logits_error=_largest([r["logits_error"] for r in results]),
        logits_bound=_largest([r["logits_bound"] for r in results]),
        logits_from_one_process=_largest([r["logits_from_one_process"] for r in results]),
        logits_half_the_experts=_largest([r["logits_half_the_experts"] for r in results]),
        logits_not_judged=results[0]["logits_not_judged"],
        trainable_seconds=trainable[0],
        trainable_peak_gib=trainable[1],
    )


def _until_trainable(results: list[LoadMeasurement]) -> tuple[float | None, float | None]:
    """Where every rank ran `deepspeed.initialize`: until training can start, and the peak over loading and it."""
    seconds, peak = 0.0, 0
    for r in results:
        initialize_seconds, initialize_peak = r["initialize_seconds"], r["initialize_peak_total"]
        if initialize_seconds is None or initialize_peak is None:
            return None, None
        seconds = max(seconds, r["seconds"] + r["touch_seconds"] + initialize_seconds)
        peak = max(peak, r["peak_total"], r["held_total"], initialize_peak)
    return seconds, peak / GIB


def _total(values: list[float | None]) -> float | None:
    """The sum, or None where a rank did not measure it (a result written before it was)."""
    return None if any(value is None for value in values) else sum(value or 0.0 for value in values)


def _slowest_reading(results: list[LoadMeasurement]) -> float | None:
    """The slowest rank's partition reads; None unless every rank read partitions."""
    reading = [r.get("reading_seconds") for r in results]
    return None if any(seconds is None for seconds in reading) else _largest(reading)


def _largest(values: list[float | None]) -> float | None:
    """The largest; NaN where a rank has NaN, None where no rank has a figure."""
    present = [value for value in values if value is not None]
    if any(math.isnan(value) for value in present):
        return math.nan
    return max(present, default=None)


def reader_row(
    shape: str, reader: Reader, ranks: int, total: int, tensors: int, results: list[ReaderMeasurement] | str
) -> Row:
    """A reader's row: every byte of the checkpoint read exactly once over the ranks; DCP's blocks equal the file's."""
    base = Row(shape, ranks, WAY_OF_READER[reader], total / GIB)
    if isinstance(results, str):
        return replace(base, error=results)
    problems = []
    if sum(r["share_bytes"] for r in results) != total:
        problems.append(f"the ranks read {sum(r['share_bytes'] for r in results)} bytes of the checkpoint's {total}")
    if reader in DCP_READERS:
        # rows: every rank holds a block of every tensor; experts whole: the tensors it holds (every byte once over
        # the ranks is the check above)
        held = [tensors if reader is Reader.DCP else r.get("held", tensors) for r in results]
        problems += [
            f"rank {r['rank']} compared {r['checked']} of {expected} tensors"
            for r, expected in zip(results, held, strict=True)
            if r["checked"] != expected
        ]
        problems += [f"rank {r['rank']}: {'; '.join(r['value_problems'][:3])}" for r in results if r["value_problems"]]
    if problems:
        return replace(base, error="; ".join(problems)[:400])
    peak, ideal = _worst([(r["peak_total"], total / ranks + r["rss_before"]) for r in results])
    return replace(
        base,
        seconds=max(r["seconds"] for r in results),
        peak_gib=peak / GIB,
        ideal_gib=ideal / GIB,
        read_rank_gib=max(r["read_bytes"] for r in results) / GIB,
        checked=min(r["checked"] for r in results) if reader in DCP_READERS else 0,
        cpu_seconds=_total([r.get("cpu_seconds") for r in results]),
    )


def read_cold(
    reader: Reader, checkpoint: Path, ranks: int, tree: Path, out: Path, timeout: float
) -> list[ReaderMeasurement] | str:
    evict_from_page_cache(checkpoint)
    spec: ReaderSpec = {"reader": str(reader), "checkpoint": str(checkpoint)}
    return read_results(launch("loadpolicy_lab.widths.worker", spec, tree, out, ranks, timeout), ReaderMeasurement)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    shape: WidthShape
    path: Path
    total: int  # bytes of its tensors
    tensors: int
    reference: Path  # the stock one-process load's fingerprints
    parameters: int
    logits: Path | None = None  # the stock one-process forwards' logits (`bench.logits`): every load's judged


def read_once(
    checkpoint: Checkpoint,
    ranks: int,
    tree: Path,
    out: Path,
    timeout: float = 600,
    reader: Reader = Reader.PREAD_IN_FLIGHT,
) -> Row:
    """One reader launch from a cold page cache, judged. By default the limit the partition reads are held to: each
    rank's share read several reads in flight into reused buffers (`Reader.PREAD_KEPT`: into memory kept as a load
    keeps it); `Reader.DCP` is the peer."""
    results = read_cold(reader, checkpoint.path, ranks, tree, out, timeout)
    return reader_row(checkpoint.shape.name, reader, ranks, checkpoint.total, checkpoint.tensors, results)


def _recorded(tree: Path, out: Path, ranks: int, timeout: float, contract: type[Contract]) -> list[Contract] | str:
    """The results an earlier launch left under `out`, read as a launch's (`--rejudge`): judged again, not run."""
    return read_results(Launched(tree, out, ranks, timeout, 0, 0.0, left_running=False), contract)


def _read_every_way(
    checkpoint: Checkpoint, count: int, trees: dict[Tree, Path], out: Path, timeout: float, *, rejudge: bool
) -> list[Row]:
    """The limits first and last, the loads, the peer; each from a cold page cache."""
    name, path, total = checkpoint.shape.name, checkpoint.path, checkpoint.total

    def reader(kind: Reader, where: Path) -> Row:
        tree = trees[Tree.PATCHED]
        results = (
            _recorded(tree, where, count, timeout, ReaderMeasurement)
            if rejudge
            else read_cold(kind, path, count, tree, where, timeout)
        )
        return reader_row(name, kind, count, total, checkpoint.tensors, results)

    limits = (Reader.PREAD, Reader.PREAD_IN_FLIGHT, Reader.PREAD_KEPT)
    first_limits = [reader(kind, out / str(kind)) for kind in limits]
    rows: list[Row] = []
    model_type = checkpoint.shape.architecture.transformers_config().model_type
    for case in (case for case in LOADS if not case.autoep or has_autoep_preset(model_type)):
        tree, where = trees[case.tree], out / f"{case.policy}-{case.layout}-{case.tree}{'-autoep' * case.autoep}"
        if rejudge:
            results = _recorded(tree, where, count, timeout, LoadMeasurement)
            rows.append(load_row(name, case, count, total, results, tree=tree, parameters=checkpoint.parameters))
        else:
            rows.append(load_once(checkpoint, case, count, tree, where, timeout))
        print(render_markdown(rows[-1:], header=False), end="", flush=True)
    rows += [reader(peer, out / str(peer)) for peer in DCP_READERS]
    # this disk's read speed drifts within a run: a limit is read before and after the other ways (after them in the
    # reverse order, so that both limits sit alike around the loads), the faster counts
    again = [reader(kind, out / f"{kind}-again") for kind in reversed(limits)][::-1]
    return [*(faster(first, second) for first, second in zip(first_limits, again, strict=True)), *rows]


def load_once(
    checkpoint: Checkpoint,
    case: Case,
    count: int,
    tree: Path,
    where: Path,
    timeout: float,
    env: dict[str, str] | None = None,
) -> Row:
    """One launch of a load of `checkpoint` from a cold page cache, judged."""
    model_class = checkpoint.shape.architecture.model_class
    spec = case.spec(count, checkpoint.path, model_class, checkpoint.reference, checkpoint.logits)
    results = launch_load(spec, count, tree, where, timeout, env=env)
    return load_row(
        checkpoint.shape.name, case, count, checkpoint.total, results, tree=tree, parameters=checkpoint.parameters
    )


def faster(first: Row, second: Row) -> Row:
    """The limit: the faster of two reads of the same share, failed if either failed."""
    if first.error or second.error:
        return first if first.error else second
    return first if (first.seconds or 0.0) <= (second.seconds or 0.0) else second


def prepare_checkpoint(shape: WidthShape, directory: Path, stock: Path, max_gib: float, timeout: float) -> Checkpoint:
    """The shape's checkpoint under `directory` (built once) and its references beside it: fingerprints, logits."""
    path = build(shape, directory.resolve(), max_gib=max_gib)
    references = directory.resolve().parent / "fingerprints" / shape.name
    spans = read_spans(path)
    model_class = shape.architecture.model_class
    reference = reference_file(path, model_class, stock, references, timeout)
    logits = logits_reference_file(path, model_class, stock, references, timeout)
    parameters = len(json.loads(reference.read_text(encoding="utf-8"))["fingerprints"])
    total = sum(s.end - s.start for s in spans)
    return Checkpoint(shape, path, total, len(spans), reference, parameters, logits)


def widths(
    out: Path,
    patches: Path,
    cache: Path,
    *,
    shapes: tuple[WidthShape, ...],
    ranks: tuple[int, ...],
    max_gib: float,
    timeout: float,
    rejudge: bool = False,
    checkpoints: Path | None = None,
) -> list[Row]:
    if rejudge:  # the trees and runs of the last run, as they are
        trees = {tree: out.resolve() / "trees" / tree.value for tree in Tree}
    else:
        trees = prepare_trees(out, patches, cache)
        prebuild_deepspeed_ops(out)
    rows: list[Row] = []
    for shape in shapes:
        checkpoint = prepare_checkpoint(shape, checkpoints or out / "checkpoints", trees[Tree.STOCK], max_gib, timeout)
        for count in ranks:
            where = out / "runs" / f"{shape.name}-{count}"
            rows += _read_every_way(checkpoint, count, trees, where, timeout, rejudge=rejudge)
    return rows


def _figure(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


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
            f"| {r.shape} | {r.ranks} | {r.way} | {_figure(r.seconds)} | {_figure(over)} | {_figure(over_in_flight)} "
            f"| {_figure(over_kept)} | {_figure(r.peak_gib)} | {_figure(r.ideal_gib)} "
            f"| {_figure(r.peak_over_ideal, 3)} | {_figure(r.read_rank_gib)} | {values} |"
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
            f"| {r.shape} | {r.ranks} | {r.way} | {_figure(r.trainable_seconds)} | {_figure(r.trainable_peak_gib)} |"
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
    error, bound, stock, half = (_figure(value, 4) for value in figures)
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
            f"{_figure(over)}x the limit ({'met' if over <= 1.5 else 'missed'})",
            f"{_figure(_over(r, by_key.get((r.shape, r.ranks, LIMIT_IN_FLIGHT))))}x the limit with 4 in flight",
            f"{_figure(_over(r, by_key.get((r.shape, r.ranks, LIMIT_KEPT))))}x the limit into memory kept",
            f"peak {_figure(r.peak_over_ideal, 3)}x ideal ({'met' if _le(r.peak_over_ideal, 1.05) else 'missed'})",
            f"{_figure(_over(peer, r))}x faster than DCP",
            f"{_figure(_over(peer_experts, r))}x faster than DCP into the same sharding",
            f"{_figure(_over(stock, r))}x faster than stock zero.Init",
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


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib  # noqa: PLC0415  # only the bench environment installs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    shapes = list(dict.fromkeys(r.shape for r in rows))
    counts = sorted({r.ranks for r in rows})
    ways = list(dict.fromkeys(r.way for r in rows))
    figure, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4.5), squeeze=False)
    width = 0.8 / max(1, len(ways))
    for column, shape in enumerate(shapes):
        axis = axes[0][column]
        for index, way in enumerate(ways):
            heights = [
                next(
                    (r.seconds or 0.0 for r in rows if (r.shape, r.ranks, r.way) == (shape, n, way) and not r.error),
                    0.0,
                )
                for n in counts
            ]
            axis.bar(
                [n + (index - len(ways) / 2) * width / len(counts) * 2 for n in range(len(counts))],
                heights,
                width * 2 / len(counts),
                label=way,
            )
        axis.set_xticks(range(len(counts)), [f"{n} ranks" for n in counts])
        axis.set_title(f"{shape}: seconds, slowest rank")
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("widths", help="published MoE shapes at full width: every way of reading, one run")
    parser.add_argument("--out", type=Path, default=Path("build/widths"), help="work and report directory")
    parser.add_argument(
        "--shape", action="append", choices=sorted(SHAPES_BY_NAME), help="only this shape (repeatable)"
    )
    parser.add_argument(
        "--ranks", type=positive_int, action="append", help="rank counts (repeatable; default 2 and 4)"
    )
    parser.add_argument("--checkpoints", type=Path, help="where the checkpoints are built (default: OUT/checkpoints)")
    parser.add_argument("--max-gib", type=float, default=MAX_GIB, help="refuse to build a checkpoint larger than this")
    parser.add_argument("--rejudge", action="store_true", help="judge and report the last run's results again")
    add_launch_arguments(parser, timeout=900.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    started = time.monotonic()
    shapes = tuple(SHAPES_BY_NAME[name] for name in args.shape) if args.shape else SHAPES
    ranks = tuple(args.ranks or (2, 4))
    rows = widths(
        args.out,
        args.patches,
        args.cache,
        shapes=shapes,
        ranks=ranks,
        max_gib=args.max_gib,
        timeout=args.timeout,
        rejudge=args.rejudge,
        checkpoints=args.checkpoints,
    )
    command = (
        "loadpolicy dev widths"
        + "".join(f" --shape {s.name}" for s in shapes if args.shape)
        + "".join(f" --ranks {n}" for n in ranks if args.ranks)
    )
    text = render_markdown(rows, command)
    (args.out / "widths.md").write_text(text, encoding="utf-8")
    (args.out / "widths.json").write_text(json.dumps([asdict(r) for r in rows], indent=2), encoding="utf-8")
    plot(rows, args.out / "widths.png")
    calibration = render_calibration(calibrate_widths([asdict(r) for r in rows]))
    (args.out / "calibration.md").write_text(calibration + "\n", encoding="utf-8")
    if failed := [r for r in rows if r.error]:
        raise WidthsFailedError(f"{text}\n{len(failed)} reads failed")
    return text + f"\n{calibration}\n\n{len(rows)} rows in {time.monotonic() - started:.0f}s: {args.out / 'widths.md'}"


class WidthsFailedError(ValidationFailedError):
    """A real-width load or read failed, or held values other than the checkpoint's."""
