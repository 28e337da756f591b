"""`loadpolicy dev widths-rounds`: one partition load against itself and the peer, in interleaved rounds.

A single run on this disk says little: the same read took 1.3 s and 3.1 s minutes apart. Here one shape at one rank
count is loaded in rounds, each round the partition load with its reads one at a time (`HF_DEACTIVATE_ASYNC_LOAD=1`),
the same load with several reads in flight (the patched tree's default) and torch DCP's `HuggingFaceStorageReader`,
every launch from a cold page cache, in forward then reverse order (A B C, C B A, ...) so that drift within the run
falls on every way alike. Every launch is judged as `dev widths` judges it (values against the stock one-process
load's fingerprints; DCP's blocks against the file); a failed judge fails the command. Writes OUT/rounds.md and
OUT/rounds.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from loadpolicy.errors import positive_int
from loadpolicy_lab.harness.launch import Tree, add_launch_arguments
from loadpolicy_lab.harness.trees import prebuild_deepspeed_ops, prepare_trees
from loadpolicy_lab.widths.cases import LOADS, PARTITION_READS, Reader
from loadpolicy_lab.widths.rows import Row
from loadpolicy_lab.widths.run import MAX_GIB, WidthsFailedError, load_once, prepare_checkpoint, read_once
from loadpolicy_lab.widths.shapes import SHAPES_BY_NAME


ONE_READ_AT_A_TIME = "one read at a time"
READS_IN_FLIGHT = "reads in flight"
PEER = "DCP"
WAYS = (ONE_READ_AT_A_TIME, READS_IN_FLIGHT, PEER)
# transformers' switch for sequential loading, which the patched partition reads follow
SEQUENTIAL = {"HF_DEACTIVATE_ASYNC_LOAD": "1"}


@dataclass(frozen=True, slots=True)
class RoundRow:
    round: int
    way: str
    row: Row


def round_order(index: int) -> tuple[str, ...]:
    """The ways of round `index`: forward in even rounds, reversed in odd ones."""
    return WAYS if index % 2 == 0 else WAYS[::-1]


def rounds(
    out: Path,
    patches: Path,
    cache: Path,
    *,
    shape: str,
    ranks: int,
    case: str,
    count: int,
    timeout: float,
    checkpoints: Path,
) -> list[RoundRow]:
    trees = prepare_trees(out, patches, cache)
    prebuild_deepspeed_ops(out)
    checkpoint = prepare_checkpoint(SHAPES_BY_NAME[shape], checkpoints, trees[Tree.STOCK], MAX_GIB, timeout)
    load = next(c for c in LOADS if c.label == case)
    found = []
    for index in range(count):
        for way in round_order(index):
            where = out / "runs" / f"{index}-{way.replace(' ', '-')}"
            if way == PEER:
                row = read_once(checkpoint, ranks, trees[Tree.PATCHED], where, timeout, Reader.DCP)
            else:
                env = SEQUENTIAL if way == ONE_READ_AT_A_TIME else None
                row = load_once(checkpoint, load, ranks, trees[load.tree], where, timeout, env=env)
            print(f"round {index}: {way}: {row.seconds if row.error is None else row.error}", flush=True)
            found.append(RoundRow(index, way, row))
    return found


def render_rounds(found: list[RoundRow], command: str) -> str:
    """A line per round (seconds of each way, the slowest rank; the load's time over DCP's), then the spread."""
    by_round: dict[int, dict[str, Row]] = {}
    for item in found:
        by_round.setdefault(item.round, {})[item.way] = item.row
    lines = [
        "# Partition reads in interleaved rounds, beside the peer",
        "",
        f"`{command}`; every launch from a cold page cache, ways in forward then reverse order; seconds of the "
        "slowest rank (loads: `from_pretrained` and a first touch of every tensor). Every launch judged: loads' "
        "values against the stock one-process load, DCP's blocks against the file.",
        "",
        f"| round | {' | '.join(WAYS)} | in flight / one at a time | in flight / DCP |",
        "|---:|" + "---:|" * (len(WAYS) + 2),
    ]
    for index, ways in sorted(by_round.items()):
        seconds = {way: ways[way].seconds for way in WAYS if way in ways and ways[way].error is None}
        cells = [f"{seconds[way]:.2f}" if way in seconds else "FAILED" for way in WAYS]
        lines.append(
            f"| {index} | {' | '.join(cells)} | {_ratio(seconds, READS_IN_FLIGHT, ONE_READ_AT_A_TIME)} | "
            f"{_ratio(seconds, READS_IN_FLIGHT, PEER)} |"
        )
    lines.append("")
    for way in WAYS:
        values = [r.row.seconds for r in found if r.way == way and r.row.error is None and r.row.seconds is not None]
        if values:
            lines.append(f"- {way}: {min(values):.2f}-{max(values):.2f} s, median {statistics.median(values):.2f} s")
    lines += [f"- FAILED {r.way} (round {r.round}): {r.row.error}" for r in found if r.row.error]
    return "\n".join(lines) + "\n"


def _ratio(seconds: dict[str, float | None], over: str, under: str) -> str:
    top, bottom = seconds.get(over), seconds.get(under)
    return "-" if top is None or not bottom else f"{top / bottom:.2f}x"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "widths-rounds", help="one real-width load, reads one at a time and in flight, beside DCP, in rounds"
    )
    parser.add_argument("--out", type=Path, default=Path("build/widths-rounds"), help="work and report directory")
    parser.add_argument("--shape", choices=sorted(SHAPES_BY_NAME), default="mixtral-8x7b")
    parser.add_argument("--ranks", type=positive_int, default=2)
    parser.add_argument("--case", choices=sorted(PARTITION_READS), default="EPMeta: partition reads")
    parser.add_argument("--rounds", type=positive_int, default=4)
    parser.add_argument("--checkpoints", type=Path, help="where the checkpoints are built (default: OUT/checkpoints)")
    add_launch_arguments(parser, timeout=900.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    started = time.monotonic()
    found = rounds(
        args.out,
        args.patches,
        args.cache,
        shape=args.shape,
        ranks=args.ranks,
        case=args.case,
        count=args.rounds,
        timeout=args.timeout,
        checkpoints=(args.checkpoints or args.out / "checkpoints").resolve(),
    )
    command = (
        f"loadpolicy dev widths-rounds --shape {args.shape} --ranks {args.ranks} --case '{args.case}' "
        f"--rounds {args.rounds}"
    )
    text = render_rounds(found, command)
    (args.out / "rounds.md").write_text(text, encoding="utf-8")
    (args.out / "rounds.json").write_text(json.dumps([asdict(r) for r in found], indent=2), encoding="utf-8")
    if failed := [r for r in found if r.row.error]:
        raise WidthsFailedError(f"{text}\n{len(failed)} launches failed")
    return text + f"\n{len(found)} launches in {time.monotonic() - started:.0f}s: {args.out / 'rounds.md'}"
