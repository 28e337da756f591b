"""`loadpolicy dev gpu` (`tox -e gpu`): the checks only a GPU can make, in one command, with a table in OUT/gpu.md and
OUT/gpu.json. Every case whose GPUs the machine has runs on the patched tree (cases.py); on a machine without a GPU
it says so in one line and exits 0. `--on-cpu` runs every case on the CPU instead (gloo, the GPUs hidden): the
command's own check where no GPU is, not a GPU result. docs/gpu.md."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadpolicy.errors import CommandError, positive_int
from loadpolicy.units import GIB
from loadpolicy_lab.gpu.cases import CASES, CASES_BY_NAME, MODEL_TYPE, STEPS, Case, Kind
from loadpolicy_lab.gpu.contract import GpuSpec, ReadResult, ReferenceResult, TrainResult
from loadpolicy_lab.gpu.judge import gigabytes_per_second, judge
from loadpolicy_lab.harness.device import DEVICE_ENV, visible_gpus
from loadpolicy_lab.harness.launch import Launcher, Tree, add_launch_arguments, launch, progress, read_results
from loadpolicy_lab.harness.trees import ready_trees


NO_GPU = (
    "no GPU visible: nothing to check here (`tox -e gpu` needs a CUDA GPU; `loadpolicy dev gpu --on-cpu` runs the "
    "same cases on the CPU)"
)
WORKER = "loadpolicy_lab.gpu.worker"


class GpuCheckFailedError(CommandError):
    """A case of the GPU check failed its judge, or its launch did not complete."""


@dataclass(frozen=True, slots=True)
class Row:
    case: str
    what: str
    ranks: int
    device: str = ""
    error: str | None = None
    load_seconds: float | None = None  # the slowest rank's from_pretrained
    device_peak_gib: float | None = None  # the largest rank's allocator peak while loading
    trained_max_diff: float | None = None
    bound: float | None = None
    read_gbps: dict[str, float] = field(default_factory=dict)  # way -> GB/s of the rank's share


def _launch_case(case: Case, spec: GpuSpec, tree: Path, out: Path, timeout: float, on_cpu: bool) -> Row:
    env = {DEVICE_ENV: "cpu" if on_cpu else case.device}
    if case.kind is Kind.READ:
        launched = launch(WORKER, spec, tree, out / case.name, 1, timeout, env=env)
        reads = read_results(launched, ReadResult)
        if isinstance(reads, str):
            return Row(case.name, case.what, case.ranks, error=reads)
        problems = judge(case, reads)
        rates = {} if problems else {k: round(v, 6) for k, v in gigabytes_per_second(reads[0]).items()}
        return Row(case.name, case.what, 1, reads[0]["device"], "; ".join(problems) or None, read_gbps=rates)
    reference_env = {DEVICE_ENV: "cpu" if on_cpu else "cuda"}
    reference = launch(
        WORKER, {**spec, "mode": "reference"}, tree, out / f"{case.name}-reference", 1, timeout, env=reference_env
    )
    referenced = read_results(reference, ReferenceResult)
    if isinstance(referenced, str):
        return Row(case.name, case.what, case.ranks, error=f"the one-device reference: {referenced}")
    # torchrun at every size: DeepSpeed reads its rank from the launcher, W = 1 included
    launched = launch(WORKER, spec, tree, out / case.name, case.ranks, timeout, launcher=Launcher.TORCHRUN, env=env)
    results = read_results(launched, TrainResult)
    if isinstance(results, str):
        return Row(case.name, case.what, case.ranks, error=results)
    problems = judge(case, results)
    peaks = [r["device_peak_bytes"] for r in results if r["device_peak_bytes"] is not None]
    return Row(
        case.name,
        case.what,
        case.ranks,
        f"{results[0]['device']} ({results[0]['backend']})",
        "; ".join(problems) or None,
        load_seconds=round(max(r["load_seconds"] for r in results), 3),
        device_peak_gib=round(max(peaks) / GIB, 3) if peaks else None,
        trained_max_diff=results[0]["trained_max_diff"],
        bound=results[0]["bound"],
    )


def gpu_check(args: argparse.Namespace, cases: list[Case]) -> list[Row]:
    out: Path = args.out.resolve()
    trees = ready_trees(out, args.patches, args.cache)
    checkpoint = out / "checkpoints" / MODEL_TYPE
    rows = []
    for case in cases:
        read_checkpoint = checkpoint
        if case.kind is Kind.READ and args.read_shape:
            from loadpolicy_lab.models.published import SHAPES_BY_NAME, build  # noqa: PLC0415  # torch, for this case only

            read_checkpoint = build(SHAPES_BY_NAME[args.read_shape], out / "widths", max_gib=args.max_gib)
        spec: GpuSpec = {
            "case": case.name,
            "mode": "read" if case.kind is Kind.READ else "distributed",
            "checkpoint": str(read_checkpoint),
            "reference": str(out / "saves" / f"{case.name}-reference"),
            "out": str(out / "saves" / case.name),
            "world": args.read_world if case.kind is Kind.READ else case.ranks,
        }
        # the read case on the tiny model (no --read-shape) needs it built: by the first reference, or here
        if read_checkpoint == checkpoint and not checkpoint.exists():
            reference = launch(
                WORKER,
                {**spec, "mode": "reference", "world": 1},
                trees[Tree.PATCHED],
                out / "build",
                1,
                args.timeout,
                env={DEVICE_ENV: "cpu"},
            )
            built = read_results(reference, ReferenceResult)
            if isinstance(built, str):
                rows.append(Row(case.name, case.what, case.ranks, error=f"building the checkpoint: {built}"))
                continue
        row = _launch_case(case, spec, trees[Tree.PATCHED], out / "runs", args.timeout, args.on_cpu)
        print(_line(row), flush=True)
        rows.append(row)
    return rows


def _line(row: Row) -> str:
    label = f"{row.case} x{row.ranks} on {row.device or '?'}"
    if row.error or row.read_gbps:
        return progress(label, row.error, ", ".join(f"{way} {rate:.3g} GB/s" for way, rate in row.read_gbps.items()))
    return progress(
        label, None, f"load {row.load_seconds:.2f}s, trained within {row.trained_max_diff:.2e} of one device"
    )


def render_markdown(rows: list[Row], skipped: list[str], command: str, on_cpu: bool) -> str:
    where = (
        "on the CPU (`--on-cpu`: the command's own check, not a GPU result)" if on_cpu else "on this machine's GPUs"
    )
    lines = [
        "# GPU check",
        "",
        f"`{command}`, {where}; patched tree; tiny {MODEL_TYPE} (float32) for the loads, each trained {STEPS} steps "
        "against one device trained on every rank's batches. docs/gpu.md.",
        "",
        "| case | ranks | device | outcome | load s | device peak GiB | trained vs one device (bound) | read GB/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        outcome = f"FAILED: {r.error}" if r.error else "ok"
        trained = "" if r.trained_max_diff is None else f"{r.trained_max_diff:.2e} ({r.bound:.0e})"
        rates = ", ".join(f"{way} {rate:.3g}" for way, rate in r.read_gbps.items())
        load = "" if r.load_seconds is None else f"{r.load_seconds:.2f}"
        peak = "" if r.device_peak_gib is None else f"{r.device_peak_gib:.3f}"
        lines.append(
            f"| {r.case}: {r.what} | {r.ranks} | {r.device} | {outcome} | {load} | {peak} | {trained} | {rates} |"
        )
    lines += ["", *(f"- not run: {s}" for s in skipped)]
    return "\n".join(lines) + "\n"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("gpu", help="what only a GPU shows: loads, saves, training and reads on the device")
    parser.add_argument("--out", type=Path, default=Path("build/gpu"), help="work and report directory")
    parser.add_argument("--on-cpu", action="store_true", help="every case on the CPU (the command's own check)")
    parser.add_argument("--case", action="append", choices=sorted(CASES_BY_NAME), help="only this case (repeatable)")
    parser.add_argument(
        "--read-shape", default="qwen3-30b-a3b", help="the published width the read case reads ('' for the tiny model)"
    )
    parser.add_argument("--read-world", type=positive_int, default=8, help="the read case reads rank 0's share of W")
    parser.add_argument("--max-gib", type=float, default=8.0, help="refuse to build a larger --read-shape checkpoint")
    add_launch_arguments(parser, timeout=300.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    gpus = 0 if args.on_cpu else visible_gpus()
    if not gpus and not args.on_cpu:
        return NO_GPU
    if args.on_cpu and args.read_shape == "qwen3-30b-a3b":
        args.read_shape = ""  # the tiny model: a published width is GPU-machine work
    chosen = [CASES_BY_NAME[name] for name in args.case] if args.case else list(CASES)
    cases = [case for case in chosen if args.on_cpu or case.gpus <= gpus]
    skipped = [f"{c.name} (needs {c.gpus} GPUs, {gpus} visible)" for c in chosen if c not in cases]
    rows = gpu_check(args, cases)
    command = "loadpolicy dev gpu" + (" --on-cpu" if args.on_cpu else "")
    text = render_markdown(rows, skipped, command, args.on_cpu)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.md").write_text(text, encoding="utf-8")
    report: dict[str, Any] = {
        "on_cpu": args.on_cpu,
        "gpus": gpus,
        "rows": [asdict(r) for r in rows],
        "skipped": skipped,
    }
    (args.out / "gpu.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    if failed := [r for r in rows if r.error]:
        raise GpuCheckFailedError(f"{text}\n{len(failed)} cases failed: " + "; ".join(_line(r) for r in failed))
    return text + f"\n{args.out / 'gpu.md'}"
