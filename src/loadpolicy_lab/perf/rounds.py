"""`loadpolicy dev perf rounds`: any set of ways to read real-width checkpoints, on one or several trees, in rounds.

A single run on this disk says little: the same read took 1.3 s and 3.1 s minutes apart. Here each shape at each rank
count is read every way asked for, round after round, every launch from a cold page cache, in forward then reverse
order (A B C, C B A, ...) so that drift within the run falls on every way alike. A way is a load (a `perf.cases`
label, optionally with ", one read at a time": `HF_DEACTIVATE_ASYNC_LOAD=1`), the read limit or torch DCP's reader;
with `--trees`, each load of the patched tree runs on every tree given (a series against the one before it). Every
launch is judged as `dev perf widths` judges it (values against the stock one-process load's fingerprints, logits
within their bound; DCP's blocks against the file); a failed judge fails the command. The report gives each way's
seconds per round, their median, and each way over the first in the same round. Writes OUT/rounds.md,
OUT/rounds.json and OUT/rounds.png (`perf.writer`).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from loadpolicy.errors import CommandError, positive_int
from loadpolicy_lab.harness.launch import Tree, add_launch_arguments
from loadpolicy_lab.harness.trees import ready_trees
from loadpolicy_lab.models.published import SHAPES_BY_NAME
from loadpolicy_lab.perf.cases import LOADS, PARTITION_READS, Case, Reader, has_autoep_preset
from loadpolicy_lab.perf.rows import Row
from loadpolicy_lab.perf.widths_run import MAX_GIB, WidthsFailedError, load_once, prepare_checkpoint, read_once
from loadpolicy_lab.perf.writer import figure, median, ratio, table, values, write


# transformers' switch for sequential loading, which the patched partition reads follow
SEQUENTIAL = {"HF_DEACTIVATE_ASYNC_LOAD": "1"}
ONE_AT_A_TIME = ", one read at a time"
READERS = {
    "limit": Reader.PREAD,
    "limit, in flight": Reader.PREAD_IN_FLIGHT,
    "limit, kept": Reader.PREAD_KEPT,
    "DCP": Reader.DCP,
    "DCP, experts whole": Reader.DCP_EXPERTS,
    "DCP, 4 threads": Reader.DCP_4_THREADS,
    "DCP, 8 threads": Reader.DCP_8_THREADS,
    "Run:ai streamer": Reader.RUNAI,
    "fastsafetensors": Reader.FASTSAFETENSORS,
}
LOADS_BY_LABEL = {case.label: case for case in LOADS}
DEFAULT_CASE = "EPMeta: partition reads"


def accepted_ways() -> list[str]:
    return [*READERS, *LOADS_BY_LABEL, *(label + ONE_AT_A_TIME for label in LOADS_BY_LABEL)]


@dataclass(frozen=True, slots=True)
class Way:
    """One launch of a round: a reader, or a load of a case on a named tree (sequential reads or not)."""

    label: str
    tree: str
    reader: Reader | None = None
    case: Case | None = None
    sequential: bool = False


def default_ways(case: str) -> list[str]:
    """The partition load with its reads one at a time and in flight, beside DCP."""
    return [case + ONE_AT_A_TIME, case, "DCP"]


def ways_for(names: Sequence[str], trees: Sequence[str]) -> tuple[Way, ...]:
    """The launches of a round for the ways `names`: a patched load on each of `trees`, labelled with its tree when
    there are several; a stock load on the stock tree; a reader on the first tree. A name not accepted is an error
    naming it and the accepted ones."""
    if unknown := [name for name in names if name not in accepted_ways()]:
        raise CommandError(f"unknown way {unknown[0]!r}; accepted: {', '.join(accepted_ways())}")
    ways: list[Way] = []
    for name in dict.fromkeys(names):
        if name in READERS:
            ways.append(Way(name, trees[0], reader=READERS[name]))
            continue
        case = LOADS_BY_LABEL[name.removesuffix(ONE_AT_A_TIME)]
        sequential = name.endswith(ONE_AT_A_TIME)
        if case.tree is Tree.STOCK:
            ways.append(Way(name, Tree.STOCK.value, case=case, sequential=sequential))
            continue
        for tree in trees:
            label = name if len(trees) == 1 else f"{name} @ {tree}"
            ways.append(Way(label, tree, case=case, sequential=sequential))
    return tuple(ways)


def round_order(ways: tuple[Way, ...], index: int) -> tuple[Way, ...]:
    """The ways of round `index`: forward in even rounds, reversed in odd ones."""
    return ways if index % 2 == 0 else ways[::-1]


def rounds(
    out: Path,
    trees: Mapping[str, Path],
    *,
    shape: str,
    ranks: int,
    ways: tuple[Way, ...],
    count: int,
    timeout: float,
    checkpoints: Path,
) -> list[Row]:
    """`count` rounds of `ways` on one shape at `ranks`, each launch judged; `trees` by name, "stock" among them."""
    checkpoint = prepare_checkpoint(SHAPES_BY_NAME[shape], checkpoints, trees[Tree.STOCK.value], MAX_GIB, timeout)
    model_type = checkpoint.shape.architecture.transformers_config().model_type
    # as `dev perf widths`: DeepSpeed AutoEP only where it has a preset for the model type (gpt-oss has none)
    ways = tuple(way for way in ways if way.case is None or not way.case.autoep or has_autoep_preset(model_type))
    found = []
    for index in range(count):
        for way in round_order(ways, index):
            where = out / "runs" / shape / str(ranks) / f"{index}-{_folder(way.label)}"
            tree = trees[way.tree]
            if way.reader is not None:
                row = read_once(checkpoint, ranks, tree, where, timeout, way.reader)
            else:
                assert way.case is not None
                env = SEQUENTIAL if way.sequential else None
                row = load_once(checkpoint, way.case, ranks, tree, where, timeout, env=env)
            print(f"{shape} x{ranks} round {index}: {way.label}: {row.error or row.seconds}", flush=True)
            found.append(replace(row, way=way.label, round=index))
    return found


def render_rounds(found: list[Row], command: str) -> str:
    """Per shape and rank count: a line per round (each way's seconds, the slowest rank; each way over the first way
    in the same round), then each way's spread and median, and every failed launch."""
    lines = [
        "# Ways to read in interleaved rounds",
        "",
        f"`{command}`; every launch from a cold page cache, ways in forward then reverse order; seconds of the "
        "slowest rank (loads: `from_pretrained` and a first touch of every tensor). Every launch judged: loads' "
        "values against the stock one-process load, DCP's blocks against the file.",
    ]
    groups: dict[tuple[str, int], list[Row]] = {}
    for row in found:
        groups.setdefault((row.shape, row.ranks), []).append(row)
    for (shape, ranks), items in groups.items():
        lines += ["", f"## {shape}, {ranks} ranks", "", *_round_table(items), "", *_spread(items)]
    return "\n".join(lines) + "\n"


def _round_table(rows: list[Row]) -> list[str]:
    ways = list(dict.fromkeys(row.way for row in rows))
    first, others = ways[0], ways[1:]
    by_round: dict[int, dict[str, Row]] = {}
    for row in rows:
        by_round.setdefault(row.round, {})[row.way] = row
    lines = []
    for index, launches in sorted(by_round.items()):
        seconds = {way: _seconds(row) for way, row in launches.items()}
        cells = [figure(seconds[way]) if seconds.get(way) is not None else "FAILED" for way in ways]
        lines.append([str(index), *cells, *(ratio(seconds.get(way), seconds.get(first)) for way in others)])
    head = ["round", *ways, *(f"{way} / {first}" for way in others)]
    return table(head, [True] * len(head), lines)


def _spread(rows: list[Row]) -> list[str]:
    ways = list(dict.fromkeys(row.way for row in rows))
    first = ways[0]
    lines = []
    for way in ways:
        mine = [row for row in rows if row.way == way]
        found = values(mine, lambda row: row.seconds)
        if not found:
            continue
        line = f"- {way}: {min(found):.2f}-{max(found):.2f} s, median {statistics.median(found):.2f} s"
        if (peak := median(mine, lambda row: row.peak_over_ideal)) is not None:
            line += f"; peak {peak:.3f}x (T/W + baseline), median"
        if way != first:
            reference = {row.round: _seconds(row) for row in rows if row.way == first}
            ratios = [s / b for row in mine if (s := _seconds(row)) and (b := reference.get(row.round))]
            if ratios:
                line += f"; over {first} in the same round: {min(ratios):.2f}-{max(ratios):.2f}x, median "
                line += f"{statistics.median(ratios):.2f}x"
        lines.append(line)
    return lines + [f"- FAILED {row.way} (round {row.round}): {row.error}" for row in rows if row.error]


def _folder(label: str) -> str:
    """A way's label as a folder name: letters, digits and dashes."""
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")


def _seconds(row: Row) -> float | None:
    return row.seconds if row.error is None else None


def _tree(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path or name == Tree.STOCK.value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=PATH (a patched tree; NAME not 'stock')")
    return name, Path(path).resolve()


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "rounds", help="real-width reads and loads, any set of ways and trees, in interleaved rounds"
    )
    parser.add_argument("--out", type=Path, default=Path("build/widths-rounds"), help="work and report directory")
    parser.add_argument("--shape", nargs="+", choices=sorted(SHAPES_BY_NAME), default=["mixtral-8x7b"])
    parser.add_argument("--ranks", nargs="+", type=positive_int, default=[2])
    parser.add_argument(
        "--case",
        choices=sorted(PARTITION_READS),
        default=DEFAULT_CASE,
        help="without --ways: this load one read at a time and in flight, beside DCP",
    )
    parser.add_argument("--ways", nargs="+", metavar="WAY", help=f"the ways of a round: {', '.join(accepted_ways())}")
    parser.add_argument(
        "--trees",
        nargs="+",
        type=_tree,
        metavar="NAME=PATH",
        help="patched trees to run every patched load on (default: the series' own, built under OUT)",
    )
    parser.add_argument("--rounds", type=positive_int, default=4)
    parser.add_argument("--checkpoints", type=Path, help="where the checkpoints are built (default: OUT/checkpoints)")
    add_launch_arguments(parser, timeout=900.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    started = time.monotonic()
    names = [name for name, _ in args.trees] if args.trees else [Tree.PATCHED.value]
    ways = ways_for(args.ways or default_ways(args.case), names)  # a bad way is refused before minutes of building
    prepared = ready_trees(args.out, args.patches, args.cache)
    named = dict(args.trees or [(Tree.PATCHED.value, prepared[Tree.PATCHED])])
    trees = {Tree.STOCK.value: prepared[Tree.STOCK], **named}
    checkpoints = (args.checkpoints or args.out / "checkpoints").resolve()
    found = []
    for shape in args.shape:
        for ranks in args.ranks:
            found += rounds(
                args.out,
                trees,
                shape=shape,
                ranks=ranks,
                ways=ways,
                count=args.rounds,
                timeout=args.timeout,
                checkpoints=checkpoints,
            )
    asked = f"--ways {' '.join(repr(w) for w in args.ways)}" if args.ways else f"--case '{args.case}'"
    given = f" --trees {' '.join(f'{n}=...' for n in named)}" if args.trees else ""
    command = (
        f"loadpolicy dev perf rounds --shape {' '.join(args.shape)} --ranks {' '.join(map(str, args.ranks))} "
        f"{asked}{given} --rounds {args.rounds}"
    )
    text = render_rounds(found, command)
    report = write(args.out, "rounds", text, found)
    if failed := [r for r in found if r.error]:
        raise WidthsFailedError(f"{text}\n{len(failed)} launches failed")
    return text + f"\n{len(found)} launches in {time.monotonic() - started:.0f}s: {report}"
