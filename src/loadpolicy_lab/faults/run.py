"""The bad-input matrix: each case must end with a clear error on every rank, fast, with nothing left running.

Every case runs under torchrun on the patched tree (EP under ZeRO-3 does not load at all on stock 5.23.0, so stock
would only show that one error). The outcome of each rank is its exception (or warning) and the seconds from the start
of `from_pretrained` to it; the launcher is bounded, and after it exits no process of its session may remain.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadpolicy.shape import LaunchShape
from loadpolicy_lab.faults.cases import FaultCase
from loadpolicy_lab.faults.contract import FaultSpec
from loadpolicy_lab.faults.judge import describe, judge
from loadpolicy_lab.harness.launch import launch
from loadpolicy_lab.models.architectures import ARCHITECTURES


MAX_SECONDS_TO_ERROR = 30.0
LAUNCH_BOUND = 120.0  # imports and process start-up included


def build_fault_checkpoints(checkpoints: Path) -> dict[str, Path]:
    """The broken variants of the tiny qwen3_moe checkpoint the cases read (built once, reused)."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    base = checkpoints / "qwen3_moe"
    variants = {name: checkpoints / f"fault-{name}" for name in ("five_experts", "quantized", "truncated")}
    variants["missing_expert"] = checkpoints / "fault-missing_expert"
    variants["tied_pair"] = checkpoints / "fault-tied_pair"
    if not (variants["five_experts"] / "config.json").exists():
        arch = ARCHITECTURES["qwen3_moe"]
        torch.manual_seed(0)
        config = arch.transformers_config(num_experts=5)
        getattr(transformers, arch.model_class)(config).save_pretrained(variants["five_experts"])
    for name in ("quantized", "truncated", "missing_expert", "tied_pair"):
        if not variants[name].exists():
            shutil.copytree(base, variants[name])
    weights = variants["truncated"] / "model.safetensors"
    if weights.stat().st_size == (base / "model.safetensors").stat().st_size:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    # A pre-quantized checkpoint: the quantizer (BitNet, which accepts a CPU) is chosen from config.json.
    config = json.loads((variants["quantized"] / "config.json").read_text(encoding="utf-8"))
    config["quantization_config"] = {
        "quant_method": "bitnet",
        "linear_class": "bitlinear",
        "quantization_mode": "offline",
    }
    (variants["quantized"] / "config.json").write_text(json.dumps(config), encoding="utf-8")
    # The embeddings and the head stored apart, and a config that ties them: loading compares the pair (collectively
    # under ZeRO-3) before it ties or keeps them apart
    tied = json.loads((variants["tied_pair"] / "config.json").read_text(encoding="utf-8"))
    tied["tie_word_embeddings"] = True
    (variants["tied_pair"] / "config.json").write_text(json.dumps(tied), encoding="utf-8")
    state = load_file(variants["missing_expert"] / "model.safetensors")
    save_file(
        {k: v for k, v in state.items() if ".experts.3." not in k},
        variants["missing_expert"] / "model.safetensors",
        metadata={"format": "pt"},
    )
    return variants | {"qwen3_moe": base}


@dataclass(frozen=True, slots=True)
class FaultOutcome:
    case: str
    ranks: int
    passed: bool
    per_rank: tuple[str, ...]  # what each rank ended with
    max_seconds: float | None  # slowest rank, from the start of from_pretrained to its outcome
    wall_seconds: float  # the whole launch, start-up included
    left_running: bool
    detail: str


def _bad_rank(case: FaultCase, ranks: int) -> int | None:
    return None if case.bad_rank is None else ranks - 1 if case.bad_rank == "last" else int(case.bad_rank)


def run_fault(case: FaultCase, ranks: int, tree: Path, variants: dict[str, Path], out: Path) -> FaultOutcome:
    shutil.rmtree(out, ignore_errors=True)  # results of an earlier run must not count
    out.mkdir(parents=True)
    bad = _bad_rank(case, ranks)
    views = {"*": str(variants[case.checkpoint])}
    if bad is not None and case.checkpoint == "qwen3_moe" and not case.killed:
        views[str(bad)] = str(variants["truncated"])
    spec: FaultSpec = {
        "model_class": ARCHITECTURES["qwen3_moe"].model_class,
        "checkpoints": views,
        "distributed": LaunchShape(ranks, case.zero3 == "before", case.layout).distributed_config(),
        "zero3": case.zero3,
        "device_map": case.device_map,
        "kill_rank": bad if case.killed else None,
        "warning": case.warning,
        "process_group": case.process_group,
        "then_collective": case.then_collective,
        "others_end": case.others_end,
    }
    launched = launch(
        "loadpolicy_lab.faults.worker",
        spec,
        tree,
        out,
        ranks,
        LAUNCH_BOUND,
        launcher=case.launcher(),
        env=dict(case.env),
    )
    results = [_read(out / f"rank{rank}.json") for rank in range(ranks)]
    log = (
        (out / "launcher.log").read_text(encoding="utf-8", errors="replace") if (out / "launcher.log").exists() else ""
    )
    per_rank = tuple(describe(result, rank, log) for rank, result in enumerate(results))
    # The ranks that must raise the error (the others of an `others_end` case end only once rank 0 has exited)
    seconds = [r["seconds"] for rank, r in enumerate(results) if r is not None and not (case.others_end and rank)]
    problems = [launched.timeout_message()] if launched.timed_out else []
    problems += ["processes of the launch were still running after it exited"] if launched.left_running else []
    problems += judge(case, bad, results, log)
    if case.error is not None and seconds and not (max(seconds) <= MAX_SECONDS_TO_ERROR):
        problems.append(f"slowest rank took {max(seconds):.1f}s > {MAX_SECONDS_TO_ERROR:.0f}s")
    detail = "; ".join(problems) or "as expected"
    return FaultOutcome(
        case.name,
        ranks,
        not problems,
        per_rank,
        max(seconds) if seconds else None,
        launched.seconds,
        launched.left_running,
        detail,
    )


def _read(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    result: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return result
