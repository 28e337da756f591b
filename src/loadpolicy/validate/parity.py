"""Training parity: K optimizer steps with EP under ZeRO-3 against the same steps in a single process."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadpolicy.validate.models import ARCHITECTURES
from loadpolicy.validate.runner import run_bounded, tree_env


MAX_RELATIVE_DIFF = 1e-5
STEPS = 5


@dataclass(frozen=True, slots=True)
class ParityOutcome:
    arch: str
    ranks: int
    clip: float
    seconds: float
    passed: bool
    detail: str
    max_loss_rel: float | None = None
    max_weight_rel: float | None = None

    @property
    def label(self) -> str:
        return f"training parity | {self.arch} | torchrun x{self.ranks} | clip {self.clip}"


def _relative(a: Any, b: Any) -> float:
    """max |a - b| / max |b| over a tensor (0 when both are zero)."""
    scale = float(b.abs().max())
    return float((a - b).abs().max()) / scale if scale else float((a - b).abs().max())


def _launch(spec: dict[str, Any], tree: Path, out: Path, ranks: int | None, timeout: float) -> str | None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    worker = ["-m", "loadpolicy.validate.parity_worker", str(out / "spec.json"), str(out)]
    command = [sys.executable, *worker]
    if ranks is not None:
        command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", *worker]
    if run_bounded(command, tree_env(tree), out / "launcher.log", timeout) is None:
        stages = [(out / f"rank{r}.stage") for r in range(ranks or 1)]
        where = [p.read_text(encoding="utf-8") if p.exists() else "no stage" for p in stages]
        return f"timed out after {timeout:.0f}s; stages per rank: {where}"
    return None


def run_parity(
    arch: str, ranks: int, clip: float, tree: Path, checkpoints: Path, out: Path, timeout: float
) -> ParityOutcome:
    import torch  # noqa: PLC0415  # the orchestrator imports torch only when it compares weights

    spec = {
        "model_class": ARCHITECTURES[arch].model_class,
        "checkpoint": str(checkpoints / arch),
        "steps": STEPS,
        "lr": 1e-3,
        "clip": clip,
    }
    start = time.monotonic()
    for mode, nproc in (("single", None), ("ep_zero3", ranks)):
        error = _launch(spec | {"mode": mode}, tree, out / mode, nproc, timeout)
        if error is not None:
            return ParityOutcome(arch, ranks, clip, time.monotonic() - start, False, f"{mode}: {error}")
    seconds = time.monotonic() - start

    def load(path: Path) -> dict[str, Any]:
        if not path.exists():
            return {"error": f"{path.name}: no result"}
        result: dict[str, Any] = torch.load(path, weights_only=True)
        return result

    single = load(out / "single" / "rank0.pt")
    if "error" in single:
        return ParityOutcome(arch, ranks, clip, seconds, False, f"single process: {single['error']}")
    results = [load(out / "ep_zero3" / f"rank{rank}.pt") for rank in range(ranks)]
    failed = next(((rank, r["error"]) for rank, r in enumerate(results) if "error" in r), None)
    if failed is not None:
        return ParityOutcome(arch, ranks, clip, seconds, False, f"rank {failed[0]}: {failed[1][:300]}")
    problems, loss_rel, weight_rel = _compare(single, results)
    detail = "; ".join(problems) or f"losses {loss_rel:.1e}, weights {weight_rel:.1e} (max relative diff)"
    return ParityOutcome(arch, ranks, clip, seconds, not problems, detail, loss_rel, weight_rel)


def _compare(single: dict[str, Any], results: list[dict[str, Any]]) -> tuple[list[str], float, float]:
    """Every rank against the single process: policy, expert shards kept, losses and final weights."""
    import torch  # noqa: PLC0415

    problems: list[str] = []
    loss_rel = weight_rel = 0.0
    worst = ""
    reference_losses = torch.tensor(single["losses"])
    for rank, result in enumerate(results):
        if result["policy"] != "EPMeta":
            problems.append(f"rank {rank}: policy {result['policy']}")
        changed = [n for n, same in result["unchanged"].items() if not same]
        if changed:
            problems.append(f"rank {rank}: expert shards changed by deepspeed.initialize: {changed}")
        loss_rel = max(loss_rel, _relative(torch.tensor(result["losses"]), reference_losses))
        for name, weight in result["weights"].items():
            full = single["weights"][name]
            if name in result["experts"]:
                n = full.shape[0] // len(results)
                full = full[rank * n : (rank + 1) * n]
            if (relative := _relative(weight, full)) > weight_rel:
                weight_rel, worst = relative, name
    if loss_rel > MAX_RELATIVE_DIFF:
        problems.append(f"losses differ by {loss_rel:.2e} (relative)")
    if weight_rel > MAX_RELATIVE_DIFF:
        problems.append(f"final weights differ by {weight_rel:.2e} (relative, worst: {worst})")
    return problems, loss_rel, weight_rel
