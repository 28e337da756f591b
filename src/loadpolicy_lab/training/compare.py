"""What every training comparison shares: the relative difference against the one-process reference, its bound, and
what an EP load must have handed to DeepSpeed. Every bound is written `not (x <= bound)`, so a NaN fails.
"""

from __future__ import annotations

from typing import Any


MAX_RELATIVE_DIFF = 1e-5


def relative_diff(a: Any, b: Any) -> float:
    """max |a - b| / max |b| over a tensor (0 when both are zero)."""
    scale = float(b.abs().max())
    return float((a - b).abs().max()) / scale if scale else float((a - b).abs().max())


def handover_problems(rank: int, policy: str, experts: list[str], unchanged: dict[str, bool]) -> list[str]:
    """EPMeta selected, expert shards handed to DeepSpeed's expert groups, and unchanged by the wrap."""
    problems = []
    if policy != "EPMeta":
        problems.append(f"rank {rank}: policy {policy}")
    if not experts:
        problems.append(f"rank {rank}: no parameter was handed to DeepSpeed's expert groups")
    changed = [n for n, same in unchanged.items() if not same]
    if changed or len(unchanged) != len(experts):
        problems.append(f"rank {rank}: expert shards changed (or unchecked) across the DeepSpeed wrap: {changed}")
    return problems
