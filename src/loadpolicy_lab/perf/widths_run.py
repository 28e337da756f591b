"""`loadpolicy dev perf widths`: published MoE shapes at full width, each read every way in the same run.

Per shape and rank count, from a cold page cache each time: the limit (every rank reading exactly its share with plain
`preadv`), each transformers load (`perf.worker`: time, peaks, values against the stock one-process load) and torch
DCP's `HuggingFaceStorageReader`. A load or read whose values are not the checkpoint's, or whose launch fails, fails
the command; the goals (partition reads within 1.5x the limit, peak <= 1.05x (T/W + baseline)) are reported, not
enforced. Writes OUT/widths.md, OUT/widths.json and OUT/widths.png (`perf.writer`); docs/benchmark.md ("Real widths").
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from loadpolicy.errors import positive_int
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
from loadpolicy_lab.harness.trees import Workspace
from loadpolicy_lab.models.published import SHAPES, SHAPES_BY_NAME, WidthShape, build
from loadpolicy_lab.perf.calibrate import calibrate_widths, render_calibration
from loadpolicy_lab.perf.cases import DCP_READERS, LOADS, Case, Reader, has_autoep_preset
from loadpolicy_lab.perf.contract import LoadMeasurement, ReaderMeasurement, ReaderSpec
from loadpolicy_lab.perf.ranges import read_spans, tensor_bytes
from loadpolicy_lab.perf.report import render_markdown
from loadpolicy_lab.perf.rows import Row, load_row, reader_row
from loadpolicy_lab.perf.run import launch_load, logits_reference_file, reference_file
from loadpolicy_lab.perf.writer import write


# the size guard: a checkpoint larger than this (GiB) is refused
MAX_GIB = 8.0


def read_cold(
    reader: Reader, checkpoint: Path, ranks: int, tree: Path, out: Path, timeout: float
) -> list[ReaderMeasurement] | str:
    evict_from_page_cache(checkpoint)
    spec: ReaderSpec = {"reader": str(reader), "checkpoint": str(checkpoint)}
    return read_results(
        launch("loadpolicy_lab.perf.reader_worker", spec, tree, out, ranks, timeout), ReaderMeasurement
    )


@dataclass(frozen=True, slots=True)
class Checkpoint:
    shape: WidthShape
    path: Path
    total: int  # bytes of its tensors
    tensors: int
    reference: Path  # the stock one-process load's fingerprints
    parameters: int
    logits: Path | None = None  # the stock one-process forwards' logits (`perf.logits`): every load's judged


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
    total = tensor_bytes(spans)
    return Checkpoint(shape, path, total, len(spans), reference, parameters, logits)


def widths(
    where: Workspace,
    *,
    shapes: tuple[WidthShape, ...],
    ranks: tuple[int, ...],
    max_gib: float,
    rejudge: bool = False,
    checkpoints: Path | None = None,
) -> list[Row]:
    out, timeout = where.out, where.timeout
    # with `rejudge`, the trees and runs of the last run, as they are
    trees = {tree: out.resolve() / "trees" / tree.value for tree in Tree} if rejudge else where.ready_trees()
    rows: list[Row] = []
    for shape in shapes:
        checkpoint = prepare_checkpoint(shape, checkpoints or out / "checkpoints", trees[Tree.STOCK], max_gib, timeout)
        for count in ranks:
            runs = out / "runs" / f"{shape.name}-{count}"
            rows += _read_every_way(checkpoint, count, trees, runs, timeout, rejudge=rejudge)
    return rows


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
        Workspace.of(args),
        shapes=shapes,
        ranks=ranks,
        max_gib=args.max_gib,
        rejudge=args.rejudge,
        checkpoints=args.checkpoints,
    )
    command = (
        "loadpolicy dev perf widths"
        + "".join(f" --shape {s.name}" for s in shapes if args.shape)
        + "".join(f" --ranks {n}" for n in ranks if args.ranks)
    )
    text = render_markdown(rows, command)
    report = write(args.out, "widths", text, rows)
    calibration = render_calibration(calibrate_widths([asdict(r) for r in rows]))
    (args.out / "calibration.md").write_text(calibration + "\n", encoding="utf-8")
    if failed := [r for r in rows if r.error]:
        raise WidthsFailedError(f"{text}\n{len(failed)} reads failed")
    return text + f"\n{calibration}\n\n{len(rows)} rows in {time.monotonic() - started:.0f}s: {report}"


class WidthsFailedError(ValidationFailedError):
    """A real-width load or read failed, or held values other than the checkpoint's."""
