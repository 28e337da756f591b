"""The save benchmark's judge: a save counts only with the policy it claims and files that hold the checkpoint's
tensors, compared by rank 0 with the checkpoint's own."""

from __future__ import annotations

from loadpolicy_lab.save.cases import Way
from loadpolicy_lab.save.contract import SaveMeasurement


def judge(way: Way, results: list[SaveMeasurement], expected_policy: str) -> list[str]:
    """What makes a save not count: another policy, or files that do not hold the checkpoint's tensors (a missing
    comparison fails)."""
    problems = [
        f"rank {r['rank']} loaded as {r['policy']}, expected {expected_policy}"
        for r in results
        if r["policy"] != expected_policy
    ]
    if way.value_checked:
        first = results[0]
        if first["saved_unequal"] is None or not (first["compared"] > 0):
            problems.append("the saved files were not compared with the checkpoint")
        elif first["saved_unequal"]:
            problems.append(f"saved tensors differ from the checkpoint's: {first['saved_unequal'][:3]}")
    return problems
