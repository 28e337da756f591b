"""AutoEP's judge: every rank of a way (EPMeta or DeepSpeed AutoEP) against the one-process reference, never
against the other way; every bound `not (x <= bound)`, so a NaN fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadpolicy_lab.autoep.cases import Way
from loadpolicy_lab.autoep.contract import ReferenceRun, WayRank
from loadpolicy_lab.training.compare import MAX_RELATIVE_DIFF, handover_problems, relative_diff


def _weights_rel(
    reference: dict[str, Any], rank: int, weights: dict[str, Any], rows: dict[str, list[int]]
) -> tuple[float, str, list[str]]:
    """max relative difference of one rank's weights (experts: its rows) from the reference, the worst name, and
    any name present on one side only or with another shape."""
    problems = [f"rank {rank}: no weight {name!r} after mapping" for name in reference if name not in weights]
    problems += [f"rank {rank}: {name!r} has no HF counterpart" for name in weights if name not in reference]
    worst, largest = "", 0.0
    for name, weight in weights.items():
        if name not in reference:
            continue
        full = reference[name]
        if name in rows:
            full = full[rows[name][0] : rows[name][1]]
        if tuple(weight.shape) != tuple(full.shape):
            problems.append(f"rank {rank}: {name} has shape {tuple(weight.shape)}, expected {tuple(full.shape)}")
            continue
        relative = relative_diff(weight, full)
        if _worse(largest, relative) != largest or not worst:  # a NaN stays the worst
            largest, worst = _worse(largest, relative), name
    return largest, worst, problems


def _worse(a: float, b: float) -> float:
    """The larger difference, NaN if either is NaN (`max` keeps whichever NaN comes first or drops it)."""
    return a + b if a != a or b != b else max(a, b)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every rank of one way against the one-process reference (relative differences; NaN where one was NaN)."""

    problems: list[str]
    loss_rel: float | None = None
    initial_rel: float | None = None
    final_rel: float | None = None
    worst: str = ""


def judge(single: ReferenceRun, results: list[WayRank], way: Way) -> Comparison:
    """Losses, weights after `deepspeed.initialize` and final weights of every rank against the reference.

    EPMeta's ranks also report what the load handed to DeepSpeed (`training.compare.handover_problems`).

    The ranks of one EP group train on the same micro-batch, so the mean of every rank's loss is the mean over the
    replicas, which is the reference's loss on the concatenated batch.
    """
    import torch  # noqa: PLC0415  # the orchestrator imports torch only when it compares

    problems: list[str] = []
    steps = {len(r["losses"]) for r in results}
    if steps != {len(single["losses"])}:
        return Comparison([f"ranks took {sorted(steps)} steps, the reference {len(single['losses'])}"])
    losses = torch.tensor([r["losses"] for r in results]).mean(dim=0)
    loss_rel = relative_diff(losses, torch.tensor(single["losses"]))
    initial_rel = final_rel = 0.0
    worst = ""
    for rank, result in enumerate(results):
        if way is Way.EPMETA:
            # a missing record of the hand-over fails the judge (empty lists fail handover_problems)
            problems += handover_problems(
                rank, result["policy"], result.get("experts", []), result.get("unchanged", {})
            )
        relative, _, found = _weights_rel(single["initial"], rank, result["initial"], result["expert_rows"])
        initial_rel = _worse(initial_rel, relative)
        problems += found
        relative, name, found = _weights_rel(single["weights"], rank, result["weights"], result["expert_rows"])
        if _worse(final_rel, relative) != final_rel or not worst:
            final_rel, worst = _worse(final_rel, relative), name
        problems += found
    for what, value in (("losses", loss_rel), ("weights after deepspeed.initialize", initial_rel)):
        if not (value <= MAX_RELATIVE_DIFF):  # NaN fails
            problems.append(f"{what} differ by {value:.2e} (relative)")
    if not (final_rel <= MAX_RELATIVE_DIFF):
        problems.append(f"final weights differ by {final_rel:.2e} (relative, worst: {worst})")
    return Comparison(sorted(set(problems)), loss_rel, initial_rel, final_rel, worst)
