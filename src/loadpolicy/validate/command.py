"""`loadpolicy validate`: build both trees and the checkpoints, run the matrix, report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from loadpolicy.faults.run import FAULT_CASES, build_fault_checkpoints, run_fault
from loadpolicy.harness.launch import Tree, ValidationFailedError, add_launch_arguments
from loadpolicy.matrix.runner import RunOutcome, launch, prepare_matrix
from loadpolicy.matrix.scenarios import fast_matrix, full_matrix
from loadpolicy.parity.run import ParityCase, Trainer, run_parity
from loadpolicy.validate.architectures import run_architectures
from loadpolicy.validate.report import (
    ValidationResults,
    render_faults,
    render_markdown,
    render_parity,
    render_table,
    write_json,
)


TOKEN_DISPATCH = (
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dispatch=True, export=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, checkpoint=True, dispatch=True),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, clip=0.0, dispatch=True),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2, dispatch=True, export=True),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, dp=2, dispatch=True),
    ParityCase("qwen3_moe", 2, Trainer.ACCELERATE, dispatch=True, export=True),
    ParityCase("mixtral", 4, Trainer.ACCELERATE, dp=2, dispatch=True),
    ParityCase("qwen3_moe", 4, Trainer.HF_TRAINER, dp=2, dispatch=True, export=True),
    ParityCase("qwen3_moe", 2, Trainer.HF_TRAINER, dispatch=True, resume=True),
)
# Training parity (EP under ZeRO-3 against one process): every way of training, both architectures, 2 and 4 ranks;
# the stock tree once per way and architecture, to show how it fails.
PARITY_FULL = (
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, export=True),
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, export=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, export=True),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd"),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True),
    *(
        ParityCase(arch, ranks, way, export=True)
        for way in (Trainer.ACCELERATE, Trainer.HF_TRAINER)
        for arch in ("qwen3_moe", "mixtral")
        for ranks in (2, 4)
    ),
    *(ParityCase(arch, 2, way, tree=Tree.STOCK) for way in Trainer for arch in ("qwen3_moe", "mixtral")),
    # world = dp x ep: 2 replicas of 2 EP ranks, ZeRO-3 owning data parallelism, each replica on its own micro-batch
    *(
        ParityCase(arch, 4, Trainer.DEEPSPEED, clip=clip, dp=2, export=clip == 0)
        for arch in ("qwen3_moe", "mixtral")
        for clip in (0, 1)
    ),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2),
    *(ParityCase(arch, 4, Trainer.HF_TRAINER, dp=2, export=True) for arch in ("qwen3_moe", "mixtral")),
    # Trainer.train(resume_from_checkpoint=...) in a new launch, at ep 2 and at dp 2 x ep 2
    ParityCase("qwen3_moe", 2, Trainer.HF_TRAINER, resume=True),
    ParityCase("mixtral", 4, Trainer.HF_TRAINER, dp=2, resume=True),
    # token dispatch: every rank its own micro-batch, tokens sent to their experts by all-to-all, ZeRO-3 owning the
    # fsdp ranks; W = 2 and 4 with ep = W, and W = 4 with ep = 2 (2 ranks hold each expert: efsdp = 2)
    *TOKEN_DISPATCH,
)
# Save -> reload runs on the stock tree's one-process load (an independent reference), so each patched way of
# training that saves has one export case here.
PARITY_FAST = (
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True),
    ParityCase("mixtral", 2, Trainer.ACCELERATE, export=True),
    ParityCase("qwen3_moe", 2, Trainer.HF_TRAINER, export=True, resume=True),
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, tree=Tree.STOCK),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2, export=True),
    # token dispatch at ep 2 over 4 ranks (efsdp 2), SGD so that a wrong gradient scale shows, saved and reloaded
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2, dispatch=True, export=True),
)
# The main job's (`tox -e multigpu`, bounded at 15 min here): the CI subset, plus each way of training with token
# dispatch, ep = world at 4 ranks, and the 4-rank Trainer at dp 2 x ep 2. `--sweep` (`tox -e multigpu-sweep`) runs
# every case of PARITY_FULL.
PARITY_MAIN = (
    *PARITY_FAST,
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, clip=0.0, dispatch=True),
    ParityCase("qwen3_moe", 2, Trainer.ACCELERATE, dispatch=True, export=True),
    ParityCase("qwen3_moe", 4, Trainer.HF_TRAINER, dp=2, dispatch=True, export=True),
    ParityCase("mixtral", 4, Trainer.HF_TRAINER, dp=2, export=True),
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
        outcome = launch(run, trees, checkpoints, out / "runs" / f"{index:03d}", timeout)
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
    command = "loadpolicy validate" + (" --fast" if args.fast else "") + (" --sweep" if args.sweep else "")
    code = validate(
        args.out, args.patches, args.cache, fast=args.fast, sweep=args.sweep, timeout=args.timeout, command=command
    )
    if code:
        raise ValidationFailedError("some runs did not behave as expected: see the table above")
    return "every run behaved as expected"
