"""The performance suite's judges: whether a load is the case it claims to be, with the checkpoint's values (at
real width too, AutoEP's regrouped experts included), whether a reader read every byte of the checkpoint once, and
whether a save wrote the checkpoint's tensors.

Every rank's figures are compared with references the stock tree made (fingerprints, logits), never with the code
under test; a field a rank did not report fails.
"""

from __future__ import annotations

from pathlib import Path

from loadpolicy.policy import PolicyName
from loadpolicy_lab.harness.launch import Tree
from loadpolicy_lab.perf.cases import HOLDING_READERS, WHOLE_READERS, Case, Reader, SaveWay
from loadpolicy_lab.perf.contract import LoadMeasurement, ReaderMeasurement, SaveMeasurement


def judge(case: Case, results: list[LoadMeasurement], tree: Path, expected_parameters: int) -> list[str]:
    """What makes a launch not `case`: another policy, another tree than `tree`, values that are not the
    checkpoint's (every rank's parameters against the stock one-process load's fingerprints, logits within their
    bound), or (stock) parameters not partitioned."""
    expected = case.policy if case.tree is Tree.PATCHED else None  # stock has no `_load_policy`
    problems = [
        f"rank {r['rank']} selected {r['policy']}, expected {expected}" for r in results if r["policy"] != expected
    ]
    src = tree.resolve() / "src"
    problems += [
        f"rank {r['rank']} imported transformers from {r['transformers_file']}, not from {src}"
        for r in results
        if not Path(r["transformers_file"]).is_relative_to(src)
    ]
    if case.branch is not None:
        problems += [
            f"rank {r['rank']} loaded through {r['loading_branch']}, expected {case.branch.value}"
            for r in results
            if r["loading_branch"] != case.branch.value
        ]
    # the values: every rank's parameters add up to the checkpoint's (no rank compared nothing)
    problems += [
        f"rank {r['rank']}: {r['fingerprinted']} of {expected_parameters} parameters compared with the checkpoint"
        for r in results
        if r["fingerprinted"] != expected_parameters
    ]
    problems += [
        f"rank {r['rank']}: values differ from the checkpoint: {'; '.join(r['value_problems'][:3])}"
        for r in results
        if r["value_problems"]
    ]
    problems += [f"rank {r['rank']}: {'; '.join(r['logits_problems'])}" for r in results if r["logits_problems"]]
    if case.policy is PolicyName.ZERO3_INIT:
        problems += [
            f"rank {r['rank']}: {r['unpartitioned']} parameters not partitioned" for r in results if r["unpartitioned"]
        ]
    return problems


def judge_load(case: Case, results: list[LoadMeasurement], tree: Path, parameters: int) -> list[str]:
    """A load at real width: the benchmark's judge, and AutoEP's forward judged (its fingerprints saw the experts
    before AutoEP regrouped them)."""
    problems = judge(case, results, tree, parameters)
    if not problems and case.autoep and results[0]["logits_not_judged"]:
        problems.append(f"AutoEP's regrouped experts not judged: {results[0]['logits_not_judged']}")
    return problems


def judge_reader(reader: Reader, results: list[ReaderMeasurement], total: int, tensors: int) -> list[str]:
    """A reader's launch: every byte of the checkpoint (`total` bytes, `tensors` tensors) read exactly once over the
    ranks; DCP's blocks equal to the file's."""
    problems = []
    if sum(r["share_bytes"] for r in results) != total:
        problems.append(f"the ranks read {sum(r['share_bytes'] for r in results)} bytes of the checkpoint's {total}")
    if reader in HOLDING_READERS:
        # rows: every rank holds a block of every tensor; tensors whole: the tensors it holds (every byte once over
        # the ranks is the check above)
        whole = reader in WHOLE_READERS
        held = [r.get("held", tensors) if whole else tensors for r in results]
        problems += [
            f"rank {r['rank']} compared {r['checked']} of {expected} tensors"
            for r, expected in zip(results, held, strict=True)
            if r["checked"] != expected
        ]
        problems += [f"rank {r['rank']}: {'; '.join(r['value_problems'][:3])}" for r in results if r["value_problems"]]
    return problems


def judge_save(way: SaveWay, results: list[SaveMeasurement], expected_policy: str) -> list[str]:
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
