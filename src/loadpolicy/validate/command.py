"""`loadpolicy dev validate`: build both trees and the checkpoints, run the matrix, report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from loadpolicy.faults.cases import FAULT_CASES
from loadpolicy.faults.run import build_fault_checkpoints, run_fault
from loadpolicy.harness.launch import Tree, ValidationFailedError, add_launch_arguments
from loadpolicy.matrix.cases import fast_matrix, full_matrix
from loadpolicy.matrix.run import RunOutcome, prepare_matrix, run_scenario
from loadpolicy.parity.cases import PARITY_FAST, PARITY_FULL, PARITY_MAIN
from loadpolicy.parity.run import run_parity
from loadpolicy.validate.architectures import run_architectures
from loadpolicy.validate.report import (
    ValidationResults,
    render_faults,
    render_markdown,
    render_parity,
    render_table,
    write_json,
)


def _visible_gpus() -> int:
    import torch

    count: int = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count


def validate(
    out: Path, patches: Path, cache: Path, *, fast: bool, timeout: float, command: str, sweep: bool = False
) -> int:
    trees, checkpoints = prepare_matrix(out, patches, cache, timeout)
    runs = fast_matrix() if fast else full_matrix(sweep=sweep)
    gpus = _visible_gpus()
    if gpus >= 2:
        # One process per GPU: transformers and DeepSpeed then pick CUDA and nccl by themselves.
        skipped = [run for run in runs if run.ranks > gpus]
        runs = [run for run in runs if run.ranks <= gpus]
        print(f"backend: nccl, {gpus} GPUs visible; skipping {len(skipped)} runs that need more ranks than GPUs")
    else:
        print("backend: gloo on CPU (fewer than 2 GPUs visible)")
    outcomes: list[RunOutcome] = []
    started = time.monotonic()
    for index, run in enumerate(runs, start=1):
        outcome = run_scenario(run, trees, checkpoints, out / "runs" / f"{index:03d}", timeout)
        outcomes.append(outcome)
        passed = sum(a.passed for a in outcome.archs)
        mark = "ok " if outcome.met_expectation else "!! "
        print(
            f"{mark}[{index}/{len(runs)}] {run.label}: {passed}/{len(outcome.archs)} archs passed "
            f"({outcome.seconds:.1f}s){' ' + outcome.launch_error if outcome.launch_error else ''}",
            flush=True,
        )
    parities = []
    cases = PARITY_FAST if fast else PARITY_FULL if sweep else PARITY_MAIN
    references: dict[str, Path] = {}  # one-process references, shared by the cases that train the same way
    for index, case in enumerate(cases, start=1):
        parity = run_parity(case, trees, checkpoints, out / "parity" / f"{index:03d}", timeout, references)
        parities.append(parity)
        mark = "ok " if parity.passed else "!! "
        print(f"{mark}[{index}/{len(cases)}] {case.label}: {parity.detail} ({parity.seconds:.1f}s)", flush=True)
    variants = build_fault_checkpoints(checkpoints)
    fault_runs = [(case, ranks) for case in FAULT_CASES for ranks in ((2,) if fast else (2, 4))]
    faults = []
    for index, (fault_case, ranks) in enumerate(fault_runs, start=1):
        fault = run_fault(fault_case, ranks, trees[Tree.PATCHED], variants, out / "faults" / f"{index:03d}")
        faults.append(fault)
        mark = "ok " if fault.passed else "!! "
        label = f"bad input | {fault_case.name} | torchrun x{ranks}"
        print(f"{mark}[{index}/{len(fault_runs)}] {label}: {fault.detail}", flush=True)
    print(render_table(outcomes))
    print(render_parity(parities))
    print(render_faults(faults))
    results = ValidationResults(outcomes, parities, faults)
    write_json(results, out / "report.json")
    (out / "report.md").write_text(render_markdown(results, command), encoding="utf-8")
    unexpected = results.unexpected()
    total = len(runs) + len(cases) + len(fault_runs)
    print(f"\n{total} runs in {time.monotonic() - started:.0f}s; {len(unexpected)} not as expected")
    print(f"report: {out / 'report.md'}, figures: {out / 'report.json'}", file=sys.stderr)
    return 1 if unexpected else 0


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
    add_launch_arguments(parser, timeout=180.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    if args.architectures:
        only = [] if args.architectures == ["all"] else args.architectures
        if run_architectures(args.out, args.patches, args.cache, timeout=args.timeout, only=only):
            raise ValidationFailedError(
                "some model types that plain EP loads on stock fail under ZeRO-3: see the table"
            )
        return "every model type that plain EP loads on stock loads under ZeRO-3 on the patched tree"
    command = "loadpolicy dev validate" + (" --fast" if args.fast else "") + (" --sweep" if args.sweep else "")
    code = validate(
        args.out, args.patches, args.cache, fast=args.fast, sweep=args.sweep, timeout=args.timeout, command=command
    )
    if code:
        raise ValidationFailedError("some runs did not behave as expected: see the table above")
    return "every run behaved as expected"
