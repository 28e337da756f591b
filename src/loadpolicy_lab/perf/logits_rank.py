"""One rank's logits judge (`perf.logits`) after a benchmark load: the forward on the fixed prompt, where it fits.

A ZeRO-3 forward gathers each module's parameters whole on every rank, and the ranks of a launch on one machine
gather together: at the published widths one experts module is GiBs (Mixtral-8x7B's is 2.6 GiB in bf16). Where the
launch's ranks on this machine cannot all hold twice the largest module in the memory available, the logits are not
judged and the row says why, rather than the kernel's OOM killer ending the launch. Twice, because once did not do:
Mixtral-8x7B's ZeRO-3 forward at 4 ranks (10.5 GiB gathered over the ranks) was OOM-killed on this 23 GiB machine,
and its 2-rank forward ran.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loadpolicy.units import GIB
from loadpolicy_lab.harness.device import collective_device, host
from loadpolicy_lab.harness.rank import Rank
from loadpolicy_lab.perf.contract import LogitsFigures
from loadpolicy_lab.perf.logits import forward_logits, judge, judge_agreement, prompt


NO_LOGITS: LogitsFigures = {
    "logits_error": None,
    "logits_bound": None,
    "logits_from_one_process": None,
    "logits_from_rank0": None,
    "logits_half_the_experts": None,
    "logits_problems": [],
    "logits_not_judged": None,
}
# room per rank for the largest module gathered, and as much beside it for what the forward allocates
GATHER_COPIES = 2


def largest_gather(model: Any) -> int:
    """Bytes of the largest module's ZeRO-3 partitioned parameters, gathered whole (0 where none is partitioned)."""
    return max(
        (
            sum(p.ds_numel * p.element_size() for p in module.parameters(recurse=False) if hasattr(p, "ds_numel"))
            for module in model.modules()
        ),
        default=0,
    )


def _available() -> int:
    for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def forward_does_not_fit(model: Any) -> str | None:
    """Why the ranks on this machine cannot run the forward together (None: they can); every rank gets the same
    answer (collective)."""
    import torch  # noqa: PLC0415

    on_this_machine = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gathered, available = largest_gather(model), _available()
    short = torch.tensor([float(GATHER_COPIES * gathered * on_this_machine > available)])
    if torch.distributed.is_initialized():
        short = short.to(collective_device())
        torch.distributed.all_reduce(short, op=torch.distributed.ReduceOp.MAX)
    if not short.item():
        return None
    return (
        f"the forward gathers {gathered / GIB:.2f} GiB per rank, {GATHER_COPIES} copies on each of "
        f"{on_this_machine} ranks here: more than the {available / GIB:.1f} GiB available"
    )


def judge_logits(this: Rank, reference: Path, engine: Any, vocab_size: int) -> LogitsFigures:
    """The forward on the fixed prompt against the stock one-process forwards and against rank 0's (collective:
    every rank runs it)."""
    import torch  # noqa: PLC0415

    this.stage("logits")
    if reason := forward_does_not_fit(getattr(engine, "module", engine)):
        return {**NO_LOGITS, "logits_not_judged": reason}
    logits = forward_logits(engine, prompt(vocab_size))
    verdict = judge(logits, torch.load(reference, weights_only=True))
    problems = [verdict.problem] if verdict.problem else []
    from_rank0 = None
    if this.world_size > 1:
        first = logits.to(collective_device(), copy=True)  # the logits are on the host (`forward_logits`)
        torch.distributed.broadcast(first, src=0)
        from_rank0, disagreement = judge_agreement(logits, host(first), verdict.bound)
        problems += [disagreement] if disagreement else []
    return {
        "logits_error": verdict.error,
        "logits_bound": verdict.bound,
        "logits_from_one_process": verdict.from_one_process,
        "logits_from_rank0": from_rank0,
        "logits_half_the_experts": verdict.half_the_experts,
        "logits_problems": problems,
        "logits_not_judged": None,
    }
