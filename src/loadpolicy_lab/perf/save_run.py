"""`loadpolicy dev perf save`: saving a loaded ZeRO-3 model, each way, on the bench's models: time and peak per rank.

Every way runs in its own launch on the patched tree (load with partition reads, then save); the files of the ways
that write a checkpoint are compared with the checkpoint's tensors by rank 0, and a way whose files differ fails the
command. Figures: the slowest rank's seconds, as a multiple of the write limit (every rank writing its partitions'
bytes with plain `pwrite` + `fsync`) and against the gathered save; each rank's peak as a multiple of what it held
before saving. Writes OUT/save.md, OUT/save.json and OUT/save.png (`perf.writer`). docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from loadpolicy.errors import positive_int
from loadpolicy.units import GIB
from loadpolicy_lab.harness.launch import (
    Tree,
    ValidationFailedError,
    add_launch_arguments,
    launch,
    progress,
    read_results,
)
from loadpolicy_lab.harness.trees import Workspace
from loadpolicy_lab.models.bench import FULL, SMOKE, BenchModel, build
from loadpolicy_lab.models.published import SHAPES_BY_NAME
from loadpolicy_lab.models.published import build as build_width
from loadpolicy_lab.perf.cases import SaveWay, save_shape
from loadpolicy_lab.perf.contract import SaveMeasurement, SaveSpec
from loadpolicy_lab.perf.judge import judge_save
from loadpolicy_lab.perf.rows import Kind, Row
from loadpolicy_lab.perf.writer import figure, key, ratio, table, write


def save_row(model: BenchModel, ranks: int, way: SaveWay, results: list[SaveMeasurement] | str) -> Row:
    """A save's row: another policy, or files that are not the checkpoint's, fail it."""
    base = Row(model.name, ranks, str(way), kind=Kind.SAVE)
    if isinstance(results, str):
        return replace(base, error=results)
    expected = "EPMeta" if model.moe else "Zero3Init"
    problems = judge_save(way, results, expected)
    return replace(
        base,
        error="; ".join(problems) or None,
        seconds=max(r["seconds"] for r in results),
        peak_gib=max(r["peak_total"] for r in results) / GIB,
        peaks_over_held=tuple(round(r["peak_total"] / r["held_total"], 3) for r in results),
        peak_rises_gib=tuple(round((r["peak_total"] - r["held_total"]) / GIB, 3) for r in results),
        checked=results[0]["compared"],
    )


def save_bench(
    where: Workspace,
    *,
    models: tuple[BenchModel, ...],
    checkpoint_of: Callable[[BenchModel], Path],
    ranks: int,
    ways: tuple[SaveWay, ...],
) -> list[Row]:
    out, timeout = where.out, where.timeout
    trees = where.ready_trees()
    rows = []
    for model in models:
        checkpoint = checkpoint_of(model)
        for way in ways:
            directory = out.resolve() / "saves" / f"{model.name}-{way}-{ranks}"
            spec: SaveSpec = {
                "way": str(way),
                "model_class": model.model_class,
                "checkpoint": str(checkpoint),
                "distributed": save_shape(model, ranks).distributed_config(),
                "directory": str(directory),
            }
            # No dirty pages of an earlier launch (the checkpoint just built, a save without fsync) written back while
            # this one is timed
            os.sync()
            launched = launch(
                "loadpolicy_lab.perf.save_worker",
                spec,
                trees[Tree.PATCHED],
                out / "runs" / directory.name,
                ranks,
                timeout,
            )
            row = save_row(model, ranks, way, read_results(launched, SaveMeasurement))
            shutil.rmtree(directory, ignore_errors=True)  # a checkpoint's worth of disk per way
            print(_line(row), flush=True)
            rows.append(row)
    return rows


def _line(row: Row) -> str:
    peak = max(row.peaks_over_held, default=math.nan)
    return progress(
        f"{row.shape} x{row.ranks} | {row.way}", row.error, f"{figure(row.seconds)}s, peak / held {peak:.3f}"
    )


def render_markdown(rows: list[Row], command: str) -> str:
    header = [
        "# Saving a loaded ZeRO-3 model",
        "",
        f"`{command}`; patched tree, CPU gloo, bf16; every way in its own launch after loading with partition reads. "
        "Time: the slowest rank's save, every rank starting together; x limit: that time over the write limit's "
        "(each rank writing its partitions' bytes with `pwrite` + `fsync`); peak / held: each rank's largest resident "
        "memory while saving over what it held before. Files of `partitions` and `gathered` compared tensor by "
        "tensor with the checkpoint by rank 0; DeepSpeed's 16-bit save writes its own layout and is not compared.",
        "",
    ]
    by_key = {key(r): r for r in rows}
    lines = []
    for r in rows:
        if r.error:
            lines.append([r.shape, str(r.ranks), r.way, *["-"] * 5, f"FAILED: {r.error[:200]}"])
            continue
        limit = by_key.get((r.shape, r.ranks, str(SaveWay.WRITE_LIMIT)))
        gathered = by_key.get((r.shape, r.ranks, str(SaveWay.GATHERED)))
        files = f"equal ({r.checked} tensors)" if SaveWay(r.way).value_checked else "not compared"
        lines.append(
            [
                r.shape,
                str(r.ranks),
                r.way,
                figure(r.seconds),
                ratio(r.seconds, limit.seconds if limit else None),
                f"{ratio(gathered.seconds if gathered else None, r.seconds)} faster",
                ", ".join(f"{x:.3f}" for x in r.peaks_over_held),
                ", ".join(f"{x:.2f}" for x in r.peak_rises_gib),
                files,
            ]
        )
    head = ["model", "ranks", "way", "time s", "x limit", "vs gathered", "peak / held, per rank", "peak rise GiB"]
    head.append("files")
    numeric = [False, True, False, True, True, True, False, False, False]
    return "\n".join([*header, *table(head, numeric, lines)]) + "\n"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("save", help="save time and peak per rank: partition writes, gathered, DeepSpeed")
    parser.add_argument("--out", type=Path, default=Path("build/save"), help="work and report directory")
    parser.add_argument("--smoke", action="store_true", help="the smoke models (CI)")
    parser.add_argument("--ranks", type=positive_int, default=2)
    parser.add_argument(
        "--way", action="append", choices=list(SaveWay), help="only this way (repeatable; default all)"
    )
    parser.add_argument(
        "--shape", action="append", choices=sorted(SHAPES_BY_NAME), help="a real-width shape instead (repeatable)"
    )
    parser.add_argument("--checkpoints", type=Path, default=Path("build/widths/checkpoints"), help="for --shape")
    parser.add_argument("--max-gib", type=float, default=8.0, help="refuse to build a --shape checkpoint larger")
    add_launch_arguments(parser, timeout=600.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    ways = tuple(SaveWay(w) for w in args.way) if args.way else tuple(SaveWay)
    models: tuple[BenchModel, ...] = SMOKE if args.smoke else FULL
    checkpoints = args.out.resolve() / "checkpoints"

    def checkpoint_of(model: BenchModel) -> Path:
        if args.shape:  # the real-width checkpoints `loadpolicy dev perf widths` builds (and reuses)
            return build_width(SHAPES_BY_NAME[model.name], args.checkpoints.resolve(), max_gib=args.max_gib)
        return build(model, checkpoints)

    if args.shape:
        models = tuple(SHAPES_BY_NAME[name].architecture for name in args.shape)
    rows = save_bench(
        Workspace.of(args),
        models=models,
        checkpoint_of=checkpoint_of,
        ranks=args.ranks,
        ways=ways,
    )
    command = f"loadpolicy dev perf save --ranks {args.ranks}" + (" --smoke" if args.smoke else "")
    command += "".join(f" --shape {name}" for name in args.shape or ())
    text = render_markdown(rows, command)
    report = write(args.out, "save", text, rows)
    if failed := [r for r in rows if r.error]:
        raise SaveBenchFailedError(f"{text}\n{len(failed)} saves failed: " + "; ".join(_line(r) for r in failed))
    return text + f"\n{report}"


class SaveBenchFailedError(ValidationFailedError):
    """A save did not complete, or wrote files that do not hold the checkpoint's tensors."""
