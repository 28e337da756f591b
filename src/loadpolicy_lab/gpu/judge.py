"""What makes a GPU check case fail, from its ranks' results alone: `judge(case, results) -> list[str]` (empty: it
passed). A missing or NaN figure fails (`not (x <= bound)`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadpolicy_lab.gpu.cases import Case, Kind


EXPECTED_POLICY = {True: "EPMeta", False: "Zero3Init"}
READ_WAYS = ("pipeline", "preadv + copy", "copy alone")


def judge(case: Case, results: Sequence[Mapping[str, Any]]) -> list[str]:
    if len(results) != case.ranks:
        return [f"{len(results)} results for {case.ranks} ranks"]
    if case.kind is Kind.READ:
        return _judge_reads(results[0])
    problems = [problem for result in results for problem in _judge_rank(case, result)]
    first = results[0]
    if first.get("saved_unequal") is None or not (first.get("compared", 0) > 0):
        problems.append("the loaded model's save was not compared with the checkpoint")
    elif first["saved_unequal"]:
        problems.append(f"saved by partition writes, differs from the checkpoint: {first['saved_unequal'][:3]}")
    diff, bound = first.get("trained_max_diff"), first.get("bound")
    if not (isinstance(diff, float | int) and isinstance(bound, float | int) and diff <= bound):
        problems.append(f"trained tensors differ from the one-device reference by {diff} (bound {bound})")
    if not (first.get("moved", 0) > 0):
        problems.append("no trained tensor moved from the checkpoint: the steps trained nothing")
    return problems


def _judge_rank(case: Case, result: Mapping[str, Any]) -> list[str]:
    """One rank's policy and placement: every partition, placeholder and buffer where the case needs it."""
    problems, rank, expected = [], result["rank"], EXPECTED_POLICY[case.ep]
    if result.get("policy") != expected:
        problems.append(f"rank {rank} loaded as {result.get('policy')}, expected {expected}")
    misplaced = result.get("misplaced")
    if misplaced is None:
        problems.append(f"rank {rank}: no placement reported")
    elif misplaced:
        problems.append(f"rank {rank}: {len(misplaced)} misplaced, e.g. {misplaced[:3]}")
    if not (result.get("placed", 0) > 0):
        problems.append(f"rank {rank}: nothing's placement was checked")
    return problems


def _judge_reads(result: Mapping[str, Any]) -> list[str]:
    problems = []
    if result.get("unequal"):
        problems.append(f"the pipeline read other bytes than the checkpoint's: {result['unequal'][:3]}")
    seconds = result.get("seconds", {})
    problems += [f"no time for {way}" for way in READ_WAYS if not (seconds.get(way, -1.0) > 0)]
    if not (result.get("bytes", 0) > 0):
        problems.append("nothing was read")
    return problems


def gigabytes_per_second(result: Mapping[str, Any]) -> dict[str, float]:
    return {way: result["bytes"] / seconds / 1e9 for way, seconds in result["seconds"].items() if seconds > 0}
