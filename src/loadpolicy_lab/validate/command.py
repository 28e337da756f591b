"""`loadpolicy dev validate`: build both trees and the checkpoints, run the matrix, report."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from loadpolicy.errors import CommandError, positive_int
from loadpolicy_lab.faults.cases import FaultCase, fault_runs
from loadpolicy_lab.faults.run import FaultOutcome, build_fault_checkpoints, run_fault
from loadpolicy_lab.harness.device import describe_launches, visible_gpus
from loadpolicy_lab.harness.launch import Tree, ValidationFailedError, add_launch_arguments, stop_every_launch
from loadpolicy_lab.harness.pool import run_all
from loadpolicy_lab.harness.trees import Workspace
from loadpolicy_lab.matrix.cases import Run, fast_matrix, full_matrix
from loadpolicy_lab.matrix.run import RunOutcome, prepare_matrix, run_scenario
from loadpolicy_lab.parity.cases import PARITY_FAST, PARITY_FULL, PARITY_MAIN, ParityCase
from loadpolicy_lab.parity.run import ParityOutcome, run_parity
from loadpolicy_lab.validate.architectures import run_architectures
from loadpolicy_lab.validate.report import (
    ValidationResults,
    render_faults,
    render_markdown,
    render_parity,
    render_table,
    write_json,
)


def validate(
    where: Workspace,
    *,
    fast: bool,
    command: str,
    sweep: bool = False,
    jobs: int | None = None,
) -> int:
    runs = fast_matrix() if fast else full_matrix(sweep=sweep)
    cases = PARITY_FAST if fast else PARITY_FULL if sweep else PARITY_MAIN
    bad_inputs = fault_runs(fast=fast, sweep=sweep)
    gpus = visible_gpus()
    jobs = _side_by_side(jobs, gpus)
    # One GPU per rank where a launch has enough (transformers, DeepSpeed and the workers then pick CUDA and nccl),
    # else the launch runs on the CPU with the GPUs hidden: `harness.launch.launch_env` decides each launch so. Said
    # (or a bad LOADPOLICY_DEVICE refused) before anything is built.
    ranks = [run.ranks for run in runs] + [r for _, r in bad_inputs]
    ranks += [r for case in cases for r in (case.ranks, case.resumed_ranks) if r]
    print(describe_launches(ranks, gpus))
    out, timeout = where.out, where.timeout
    trees, checkpoints = prepare_matrix(out, where.patches, where.cache, timeout)
    variants = build_fault_checkpoints(checkpoints)
    print(f"{len(runs)} loads, {len(cases)} training cases, {len(bad_inputs)} bad inputs; {jobs} launch(es) at a time")
    work = _launches(runs, cases, bad_inputs, trees, checkpoints, variants, out, timeout)
    started = time.monotonic()
    first_bad_input = len(runs) + len(cases)
    results = run_all(
        [job for _, job in work],
        jobs,
        lambda index, result: print(_line(work[index][0], result), flush=True),
        stop_every_launch,
        waiting={first_bad_input + i for i, (case, _) in enumerate(bad_inputs) if case.waits_on_a_bound},
    )
    report = _report(results)
    write_json(report, out / "report.json")
    (out / "report.md").write_text(render_markdown(report, command), encoding="utf-8")
    unexpected = report.unexpected()
    print(f"\n{len(work)} runs in {time.monotonic() - started:.0f}s; {len(unexpected)} not as expected")
    print(f"report: {out / 'report.md'}, figures: {out / 'report.json'}", file=sys.stderr)
    return 1 if unexpected else 0


def _launches(
    runs: list[Run],
    cases: tuple[ParityCase, ...],
    bad_inputs: list[tuple[FaultCase, int]],
    trees: dict[Tree, Path],
    checkpoints: Path,
    variants: dict[str, Path],
    out: Path,
    timeout: float,
) -> list[tuple[str, Callable[[], RunOutcome | ParityOutcome | FaultOutcome]]]:
    """(label, launch) of every load, training case and bad input, in that order."""
    references: dict[str, Path] = {}  # one-process references, shared by the cases that train the same way
    tree = trees[Tree.PATCHED]
    return [
        *(
            (
                f"[{i}/{len(runs)}] {run.label}",
                partial(run_scenario, run, trees, checkpoints, out / "runs" / f"{i:03d}", timeout),
            )
            for i, run in enumerate(runs, 1)
        ),
        *(
            (
                f"[{i}/{len(cases)}] {case.label}",
                partial(run_parity, case, trees, checkpoints, out / "parity" / f"{i:03d}", timeout, references),
            )
            for i, case in enumerate(cases, 1)
        ),
        *(
            (
                f"[{i}/{len(bad_inputs)}] bad input | {case.name} | torchrun x{ranks}",
                partial(run_fault, case, ranks, tree, variants, out / "faults" / f"{i:03d}"),
            )
            for i, (case, ranks) in enumerate(bad_inputs, 1)
        ),
    ]


def _side_by_side(jobs: int | None, gpus: int) -> int:
    """Launches at a time: side by side on a CPU machine (each leaves cores idle at start-up and while ranks wait on
    each other); one at a time on GPUs, where every launch takes one GPU per rank."""
    if jobs is not None and jobs > 1 and gpus >= 2:
        raise CommandError(
            f"--jobs {jobs} with {gpus} GPUs visible: launches side by side would share them; accepted with GPUs: 1"
        )
    return jobs or (1 if gpus >= 2 else 2)


def _report(results: list[RunOutcome | ParityOutcome | FaultOutcome]) -> ValidationResults:
    """The loads, training cases and bad inputs of `results`, printed as tables."""
    outcomes = [r for r in results if isinstance(r, RunOutcome)]
    parities = [r for r in results if isinstance(r, ParityOutcome)]
    faults = [r for r in results if isinstance(r, FaultOutcome)]
    print(render_table(outcomes))
    print(render_parity(parities))
    print(render_faults(faults))
    return ValidationResults(outcomes, parities, faults)


def _line(label: str, result: RunOutcome | ParityOutcome | FaultOutcome) -> str:
    """How one finished launch is reported as it ends."""
    if isinstance(result, RunOutcome):
        passed = sum(a.passed for a in result.archs)
        error = " " + result.launch_error if result.launch_error else ""
        summary = f"{passed}/{len(result.archs)} archs passed ({result.seconds:.1f}s){error}"
        return f"{'ok ' if result.met_expectation else '!! '}{label}: {summary}"
    if isinstance(result, ParityOutcome):
        return f"{'ok ' if result.passed else '!! '}{label}: {result.detail} ({result.seconds:.1f}s)"
    return f"{'ok ' if result.passed else '!! '}{label}: {result.detail} ({result.wall_seconds:.1f}s)"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate", help="real multi-process loads on stock and patched transformers, with a report"
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--fast", action="store_true", help="every scenario once at 2 ranks (the CI subset)")
    size.add_argument("--sweep", action="store_true", help="every training-parity case (the long sweep)")
    size.add_argument(
        "--architectures",
        nargs="+",
        metavar="MODEL_TYPE",
        help="every EP-capable model type of the pinned release generated tiny ('all'), or the ones named",
    )
    parser.add_argument("--out", type=Path, default=Path("build/validate"), help="work and report directory")
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        help="launches run side by side (default: 2 on CPU, 1 with GPUs, where each launch takes one per rank)",
    )
    add_launch_arguments(parser, timeout=180.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    if args.architectures:
        only = [] if args.architectures == ["all"] else args.architectures
        if run_architectures(Workspace.of(args), only=only):
            raise ValidationFailedError(
                "some model types that plain EP loads on stock fail under ZeRO-3: see the table"
            )
        return "every model type that plain EP loads on stock loads under ZeRO-3 on the patched tree"
    command = "loadpolicy dev validate" + (" --fast" if args.fast else "") + (" --sweep" if args.sweep else "")
    code = validate(
        Workspace.of(args),
        fast=args.fast,
        sweep=args.sweep,
        command=command,
        jobs=args.jobs,
    )
    if code:
        raise ValidationFailedError("some runs did not behave as expected: see the table above")
    return "every run behaved as expected"
