"""The load matrix's judge: one architecture of one run, from every rank's report, against what its scenario expects.

Every bound is written `not (x <= bound)` and every compared field must be there, so a NaN or a missing figure fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from loadpolicy.policy import LoadingBranch, PolicyName
from loadpolicy.shape import EPLayout
from loadpolicy_lab.harness.launch import Tree
from loadpolicy_lab.harness.rank import raised_at
from loadpolicy_lab.matrix.cases import Run
from loadpolicy_lab.matrix.contract import LoadCheck, RankReport


MAX_ABS_DIFF = 1e-5
NAN = float("nan")  # what a missing figure reads as: it fails every `not (x <= bound)`


@dataclass(frozen=True, slots=True)
class ArchOutcome:
    arch: str
    passed: bool
    detail: str  # why it failed, or what it proved
    figures: dict[str, Any] = field(default_factory=dict)
    # on stock, where the scenario must fail: every rank raised the scenario's stock error (not any failure)
    failed_as_expected: bool = False


def judge(run: Run, arch: str, ranks: list[RankReport | None]) -> ArchOutcome:
    """`arch` in `run`, from every rank's report (None: the rank wrote none): what the scenario expects of this tree,
    against the stock one-process reference the ranks compared with, never against the code under test."""
    per_rank = []
    for rank, data in enumerate(ranks):
        if data is None:
            return ArchOutcome(arch, False, f"rank {rank}: no result")
        result = data.get("results", {}).get(arch)
        if result is None:
            return ArchOutcome(arch, False, f"rank {rank}: not reached ({data.get('error', 'no result')})")
        per_rank.append(result)
    errors = [(rank, r["error"]) for rank, r in enumerate(per_rank) if "error" in r]
    stock_error = run.spec.stock_error
    if stock_error is not None and run.tree is Tree.STOCK:
        return _judge_stock_failure(arch, stock_error, per_rank)
    refusal = run.spec.refusal
    if refusal is not None and run.tree is Tree.PATCHED:
        missing = [rank for rank, r in enumerate(per_rank) if refusal not in r.get("error", "")]
        if missing:
            return ArchOutcome(arch, False, f"ranks {missing} did not refuse with {refusal!r}")
        return ArchOutcome(arch, True, f"refused on every rank: {per_rank[0]['error'][:160]}")
    if errors:
        rank, message = errors[0]
        where = raised_at(per_rank[rank].get("traceback", ""))
        return ArchOutcome(arch, False, f"rank {rank}: {message[:200]}" + (f" (at {where})" if where else ""))
    problems = [f"rank {rank}: {p}" for rank, r in enumerate(per_rank) for p in _problems(run, r)]
    policies = {r["policy"] for r in per_rank}
    if len(policies) != 1:
        problems.append(f"ranks chose different policies: {[r['policy'] for r in per_rank]}")
    figures = {"max_abs_diff": max(r.get("max_abs_diff", NAN) for r in per_rank), "policy": per_rank[0]["policy"]}
    if problems:
        return ArchOutcome(arch, False, "; ".join(problems)[:400], figures)
    return ArchOutcome(arch, True, f"{figures['policy']}, max abs diff {figures['max_abs_diff']:.1e}", figures)


def _judge_stock_failure(arch: str, stock_error: str, per_rank: list[LoadCheck]) -> ArchOutcome:
    """Stock must fail with the known bug on every rank; any other failure (a crash, a timeout) is not the bug."""
    other = [rank for rank, r in enumerate(per_rank) if stock_error not in r.get("error", "")]
    if other:
        detail = f"ranks {other} did not fail with {stock_error!r}: " + str(per_rank[other[0]].get("error", "loaded"))
        return ArchOutcome(arch, False, detail[:300])
    return ArchOutcome(arch, False, f"rank 0: {per_rank[0]['error'][:200]}", failed_as_expected=True)


def _problems(run: Run, result: LoadCheck) -> list[str]:
    problems = []
    expected = run.spec.patched_policy if run.tree is Tree.PATCHED else None
    if result["policy"] != expected:
        problems.append(f"policy {result['policy']}, expected {expected}")
    if result["on_meta"]:
        problems.append(f"left on meta: {result['on_meta'][:3]}")
    problems.extend(
        f"{kind}: {result[kind][:3]}"
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")
        if result[kind]
    )
    problems.extend(_placement_problems(run, result))
    if not ((diff := result.get("max_abs_diff", NAN)) <= MAX_ABS_DIFF):  # NaN (or no figure) fails
        problems.append(f"logits differ from the stock one-process load by {diff:.2e}")
    return problems


def _placement_problems(run: Run, result: LoadCheck) -> list[str]:
    """Zero3Init: every parameter partitioned, gathered equal to the checkpoint. EP: each rank's expert slice."""
    problems = []
    if run.spec.bnb_8bit and not (result.get("quantized_8bit", 0) > 0):
        problems.append("no parameter was quantized to 8 bits")
    if run.spec.patched_policy is PolicyName.ZERO3_INIT:
        # The patched tree reads each rank's partitions; stock gathers and copies
        branch = LoadingBranch.ZERO3_READ_PARTITIONS.value if run.tree is Tree.PATCHED else None
        problems += _partition_problems(result, branch)
        problems += _unequal_problems(result, "gathered_unequal", "gathered values")
        if run.tree is Tree.PATCHED:
            problems += _saved_problems(result)
        return problems
    if run.spec.patched_policy is PolicyName.EP_META and run.tree is Tree.PATCHED:
        # The patched tree partitions the meta model before reading: nothing left whole for DeepSpeed
        problems += _partition_problems(result, LoadingBranch.ZERO3_READ_PARTITIONS.value)
        problems += _saved_problems(result)
    problems += _unequal_problems(result, "dense_unequal", "parameters outside the experts")
    if run.spec.layout is not EPLayout.NONE:
        if not result.get("experts"):
            problems.append("no expert parameters found")
        for name, expert in result.get("experts", {}).items():
            local, full = expert["local"], expert["full"]
            if local[0] * run.ranks != full[0]:
                problems.append(f"{name}: local shape {local}, full {full}")
            if not expert["equal"]:
                problems.append(f"{name}: not this rank's slice of the checkpoint")
    return problems


def _saved_problems(result: LoadCheck) -> list[str]:
    """Where partitions were read, each rank writes its own when saving: the files must hold the checkpoint's tensors
    under its names; a missing field fails (nothing was saved or compared)."""
    if "saved_unequal" not in result:
        return ["save_pretrained's files were not compared with the checkpoint (no 'saved_unequal')"]
    if result["saved_unequal"]:
        return [f"saved tensors differ from the checkpoint's: {result['saved_unequal'][:3]}"]
    return []


def _partition_problems(result: LoadCheck, branch: str | None) -> list[str]:
    """The loader the ranks report, and every parameter a ZeRO-3 partition."""
    problems = []
    if result.get("loading_branch") != branch:
        problems.append(f"loading branch {result.get('loading_branch')}, expected {branch}")
    if result["partitioned"] != result["parameters"]:
        problems.append(f"only {result['partitioned']}/{result['parameters']} parameters partitioned")
    return problems


def _unequal_problems(result: LoadCheck, field: Literal["gathered_unequal", "dense_unequal"], what: str) -> list[str]:
    """Names whose values differ from the stock tree's one-process load; a missing field fails (nothing compared)."""
    if field not in result:
        return [f"{what} were not compared with the reference (no {field!r})"]
    if result[field]:
        return [f"{what} differ from the stock one-process load: {result[field][:3]}"]
    return []
