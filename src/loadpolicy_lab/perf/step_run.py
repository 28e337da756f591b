"""`loadpolicy dev perf step`: one training step at real width, every way of loading under ZeRO-3, against the
stock tree's one-process step (`perf.step`).

By default the smallest published shape, cut to STEP_LAYERS layers, at 2 ranks: each rank holds its bf16 partitions,
their float32 copies and gradients (10 bytes a parameter over the ranks) beside the modules it gathers, and the three
layers of DeepSeek-V2-Lite's table shape took 9.5 GB per rank before one was OOM-killed on this 24 GiB machine. A
launch fails the command when a rank fails, reports another policy than its case's, or its step is not the reference's
within the bound. Writes OUT/step.md and OUT/step.json (`perf.writer`); docs/benchmark.md ("One training step at
width").
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from dataclasses import replace
from pathlib import Path

from loadpolicy.errors import positive_int
from loadpolicy_lab.harness.launch import Tree, ValidationFailedError, add_launch_arguments, launch, read_results
from loadpolicy_lab.harness.trees import Workspace
from loadpolicy_lab.models.published import SHAPES, SHAPES_BY_NAME, WidthShape, build, checkpoint_bytes, with_layers
from loadpolicy_lab.perf.cases import LOADS, Case
from loadpolicy_lab.perf.rows import Kind, Row
from loadpolicy_lab.perf.run import FIXED_MALLOC, one_process
from loadpolicy_lab.perf.step import REFERENCE_NAME, judge_step
from loadpolicy_lab.perf.step_worker import StepRank, StepSpec
from loadpolicy_lab.perf.widths_run import MAX_GIB
from loadpolicy_lab.perf.writer import write


# every way of loading that trains under ZeRO-3; stock zero.Init is the control the bound must pass too
STEP_CASES = tuple(case for case in LOADS if case.zero3)


@functools.cache
def smallest_shape() -> WidthShape:
    """The published shape of the fewest checkpoint bytes (its models are built on the meta device: torch)."""
    return min(SHAPES, key=checkpoint_bytes)


# DeepSeek-V2-Lite's first dense layer and first MoE layer; a shape with fewer layers keeps them all
STEP_LAYERS = 2


def replicas(case: Case, ranks: int) -> int:
    """The case's data-parallel replicas, each with its own micro-batch: every rank without EP or with token dispatch,
    one per tp = ep group otherwise."""
    sizes = case.shape(ranks).distributed_config()
    if sizes is None:
        return ranks
    return int(sizes.get("dp_replicate_size", 1)) * int(sizes.get("fsdp_size", 1))


def step_once(
    checkpoint: Path,
    model_class: str,
    reference_path: Path,
    case: Case,
    ranks: int,
    trees: dict[Tree, Path],
    where: Path,
    timeout: float,
) -> Row:
    """One launch of `case`'s step, judged against the one-process step at `reference_path` (`perf.step`)."""
    import torch  # noqa: PLC0415

    spec: StepSpec = {
        **case.spec(ranks, checkpoint, model_class, Path()),
        "step_reference": str(reference_path),
        "replicas": replicas(case, ranks),
    }
    start = time.monotonic()
    launched = launch(
        "loadpolicy_lab.perf.step_worker", spec, trees[case.tree], where, ranks, timeout, env=FIXED_MALLOC
    )
    results = read_results(launched, StepRank)
    seconds = time.monotonic() - start
    row = Row(checkpoint.name, ranks, case.label, kind=Kind.STEP, seconds=seconds)
    if isinstance(results, str):
        return replace(row, error=results)
    expected = case.policy if case.tree is Tree.PATCHED else None
    if wrong := [f"rank {r['rank']} selected {r['policy']}" for r in results if r["policy"] != expected]:
        return replace(row, error=f"{'; '.join(wrong)}, expected {expected}")
    reference = torch.load(reference_path, weights_only=True)
    return replace(row, verdict=judge_step(reference, [r["loss"] for r in results], [r["samples"] for r in results]))


def widths_step(
    where: Workspace, checkpoints: Path, shape: WidthShape, ranks: int, cases: tuple[Case, ...] = STEP_CASES
) -> list[Row]:
    trees, timeout = where.ready_trees(), where.timeout
    path, model_class, reference = prepare_step(shape, checkpoints, trees[Tree.STOCK], timeout)
    runs = where.out / "runs"
    return [
        step_once(path, model_class, reference, case, ranks, trees, runs / case.label.replace(" ", "_"), timeout)
        for case in cases
    ]


def prepare_step(shape: WidthShape, checkpoints: Path, stock: Path, timeout: float) -> tuple[Path, str, Path]:
    """The shape's checkpoint (built once) and the stock tree's one-process step on it: (checkpoint, model class,
    the reference step's file)."""
    path = build(shape, checkpoints.resolve(), max_gib=MAX_GIB)
    model_class = shape.architecture.model_class
    reference = checkpoints.resolve().parent / "fingerprints" / shape.name / REFERENCE_NAME
    one_process(path, model_class, stock, reference, timeout, "loadpolicy_lab.perf.step")
    return path, model_class, reference


def _ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def render_markdown(rows: list[Row], command: str) -> str:
    lines = [
        f"`{command}`: one SGD step (bf16, ZeRO-3) against the stock one-process step; per parameter, root mean square"
        " error over its bound (2x the one-process bf16 step's), the worst parameter; <= 1 passes.",
        "",
        "| shape | load | ranks | loss (float32 / bf16 one process) | gradients | weights after the step |"
        " halved expert gradient | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.verdict is None:
            lines.append(f"| {row.shape} | {row.way} | {row.ranks} | - | - | - | - | failed: {row.error} |")
            continue
        v = row.verdict
        verdict = "; ".join(v.problems[:3]) + (" ..." if len(v.problems) > 3 else "") if v.problems else "pass"
        lines.append(
            f"| {row.shape} | {row.way} | {row.ranks} | {v.loss:.5f} ({v.loss_float32:.5f} / {v.loss_bf16:.5f}) |"
            f" {_ratio(v.grad_ratio)} ({v.grad_worst}) | {_ratio(v.weight_ratio)} ({v.weight_worst}) |"
            f" {_ratio(v.reach)} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("step", help="one training step at real width against one process")
    parser.add_argument("--out", type=Path, default=Path("build/widths-step"), help="work and report directory")
    parser.add_argument("--shape", choices=sorted(SHAPES_BY_NAME), default=smallest_shape().name, help="the shape")
    parser.add_argument("--ranks", type=positive_int, default=2, help="ranks (default 2)")
    parser.add_argument(
        "--layers", type=positive_int, default=STEP_LAYERS, help=f"cut the shape to this many layers ({STEP_LAYERS})"
    )
    parser.add_argument("--checkpoints", type=Path, default=Path("build/widths/checkpoints"), help="checkpoints")
    parser.add_argument(
        "--case", action="append", choices=[case.label for case in STEP_CASES], help="only this load (repeatable)"
    )
    add_launch_arguments(parser, timeout=900.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    shape = with_layers(SHAPES_BY_NAME[args.shape], args.layers)
    cases = tuple(case for case in STEP_CASES if not args.case or case.label in args.case)
    rows = widths_step(Workspace.of(args), args.checkpoints, shape, args.ranks, cases)
    command = f"loadpolicy dev perf step --shape {args.shape} --layers {args.layers} --ranks {args.ranks}"
    text = render_markdown(rows, command + "".join(f" --case '{case.label}'" for case in cases if args.case))
    write(args.out, "step", text, rows, plot=False)
    if failed := [row for row in rows if row.failed]:
        raise StepFailedError(f"{text}\n{len(failed)} of {len(rows)} steps failed")
    return text


class StepFailedError(ValidationFailedError):
    """A launch of the step failed, or its step is not the one-process step's within the bound."""
