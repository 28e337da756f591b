"""The real-width run's judge: a load as the benchmark judges it (its values and logits against the stock tree's
references), and AutoEP's logits judged after it regrouped the experts; a reader's bytes against the file's.
"""

from __future__ import annotations

from pathlib import Path

from loadpolicy_lab.bench.cases import Case
from loadpolicy_lab.bench.contract import LoadMeasurement
from loadpolicy_lab.bench.judge import judge as judge_bench_load
from loadpolicy_lab.widths.cases import DCP_ANY, Reader
from loadpolicy_lab.widths.contract import ReaderMeasurement


def judge_load(case: Case, results: list[LoadMeasurement], tree: Path, parameters: int) -> list[str]:
    """A load at real width: the benchmark's judge, and AutoEP's forward judged (its fingerprints saw the experts
    before AutoEP regrouped them)."""
    problems = judge_bench_load(case, results, tree, parameters)
    if not problems and case.autoep and results[0]["logits_not_judged"]:
        problems.append(f"AutoEP's regrouped experts not judged: {results[0]['logits_not_judged']}")
    return problems


def judge(reader: Reader, results: list[ReaderMeasurement], total: int, tensors: int) -> list[str]:
    """A reader's launch: every byte of the checkpoint (`total` bytes, `tensors` tensors) read exactly once over the
    ranks; DCP's blocks equal to the file's."""
    problems = []
    if sum(r["share_bytes"] for r in results) != total:
        problems.append(f"the ranks read {sum(r['share_bytes'] for r in results)} bytes of the checkpoint's {total}")
    if reader in DCP_ANY:
        # rows: every rank holds a block of every tensor; experts whole: the tensors it holds (every byte once over
        # the ranks is the check above)
        held = [r.get("held", tensors) if reader is Reader.DCP_EXPERTS else tensors for r in results]
        problems += [
            f"rank {r['rank']} compared {r['checked']} of {expected} tensors"
            for r, expected in zip(results, held, strict=True)
            if r["checked"] != expected
        ]
        problems += [f"rank {r['rank']}: {'; '.join(r['value_problems'][:3])}" for r in results if r["value_problems"]]
    return problems
