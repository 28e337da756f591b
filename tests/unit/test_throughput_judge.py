"""The training-throughput judge and its figures, on synthetic rank results (real runs: `dev throughput`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from loadpolicy_lab.throughput.cases import Way
from loadpolicy_lab.throughput.contract import ThroughputRank
from loadpolicy_lab.throughput.judge import Row, judge, row_of
from loadpolicy_lab.throughput.run import dispatch_against_autoep, render_markdown


def rank(way: str, r: int, *, policy: str | None, loss: float, step: float, batches: int = 2) -> ThroughputRank:
    times = {"forward": step / 4, "backward": step / 2, "optimizer": step / 4, "total": step}
    return {
        "rank": r,
        "way": way,
        "policy": policy,
        "tokens_per_step": 64,
        "distinct_batches": batches,
        "losses": [loss, loss - 0.1],
        "steps": [times, times],  # type: ignore[list-item]
        "collectives": {"all-to-all": 0.01},
        "profile_top": {"aten::mm": 0.5},
        "profile_top_by_phase": {"forward": {"aten::mm": 0.2}, "backward": {"aten::mm": 0.3}, "optimizer": {}},
        "profile_calls_by_phase": {"forward": {"aten::mm": 40}, "backward": {"aten::mm": 80}, "optimizer": {}},
        "peak_training_bytes": 2**30,
        "threads": 1,
        "experts_kernel": "grouped_mm",
    }


def rows(**changes: Any) -> list[Row]:
    made = []
    for way, policy, batches in (
        ("dispatch", "EPMeta", 2),
        ("tp_ep", "EPMeta", 1),
        ("autoep", None, 2),
        ("zero3", None, 2),
    ):
        results = [rank(way, r, policy=policy, loss=5.0 + 0.01 * r, step=2.0, batches=batches) for r in range(2)]
        for r in results:
            r.update(changes.get(way, {}))  # type: ignore[typeddict-item]
        made.append(row_of(way, Way(way).shape(2, 2), 2, 10.0, results))
    return made


def test_the_same_data_from_the_same_weights_gives_the_same_first_loss() -> None:
    assert judge(rows()) == []


def test_tokens_per_second_counts_the_distinct_tokens_the_world_trained() -> None:
    by_way = {r.way: r for r in rows()}
    assert by_way["dispatch"].tokens_per_s_per_rank == pytest.approx(64 / 2.0)
    # the two ranks of a tp = ep group train one micro-batch between them
    assert by_way["tp_ep"].tokens_per_s_per_rank == pytest.approx(64 / 2 / 2.0)


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"dispatch": {"losses": [float("nan"), 1.0]}}, "dispatch: losses [nan, 1] vs zero3's"),
        ({"autoep": {"losses": [5.1, 5.0]}}, "autoep: losses [5.1, 5] vs zero3's"),
        # the same first loss, then training apart: every step is judged, not the first alone
        ({"dispatch": {"losses": [5.005, 4.805]}}, "dispatch: losses [5.005, 4.805] vs zero3's [5.005, 4.905]"),
        ({"autoep": {"losses": [5.005, float("nan")]}}, "autoep: losses [5.005, nan] vs zero3's"),
        ({"dispatch": {"policy": "MetaShardOnRead"}}, "dispatch: rank 0 selected MetaShardOnRead, expected EPMeta"),
        ({"zero3": {"policy": "EPMeta"}}, "zero3: rank 0 selected EPMeta, expected None"),
        ({"dispatch": {"distinct_batches": 1}}, "dispatch: rank 0 trained 1 batches per step, the launch has 2"),
    ],
)
def test_the_judge_names_what_is_wrong(changes: dict[str, Any], needle: str) -> None:
    problems = judge(rows(**changes))
    assert any(needle in p for p in problems), problems


def test_a_failed_way_or_a_missing_reference_fails() -> None:
    broken = [r for r in rows() if r.way != "zero3"] + [Row("zero3", 2, 2, 1.0, error="rank 1 failed")]
    problems = judge(broken)
    assert "zero3: rank 1 failed" in problems
    assert "dispatch: no losses to compare with zero3's" in problems


def test_rounds_compare_dispatch_with_the_autoep_run_of_the_same_round() -> None:
    def steps(total: float) -> dict[str, Any]:
        return {"steps": [{"forward": 1, "backward": 1, "optimizer": total - 2, "total": total}] * 2}

    first, second = rows(), rows(dispatch=steps(8.0), autoep=steps(4.0))
    both = first + [replace(r, repeat=1) for r in second]
    # round 1: the same step time; round 2: dispatch takes twice the 4.0 s of that round's AutoEP (not of round 1's)
    assert dispatch_against_autoep(both) == {2: [pytest.approx(1.0), pytest.approx(0.5)]}
    table = render_markdown(both, "loadpolicy dev throughput --repeats 2", "tiny", 64)
    assert "| round | way |" in table
    assert "1.00x, 0.50x (median 0.75x over 2 rounds)" in table
    assert "| round |" not in render_markdown(first, "loadpolicy dev throughput", "tiny", 64)


def test_without_plain_zero3_the_same_data_ways_are_judged_against_each_other() -> None:
    pair = [r for r in rows() if r.way in ("dispatch", "autoep")]
    assert judge(pair) == []
    apart = [r for r in rows(autoep={"losses": [5.005, 4.805]}) if r.way in ("dispatch", "autoep")]
    assert any(p.startswith("autoep: losses [5.005, 4.805] vs dispatch's") for p in judge(apart)), judge(apart)


def test_a_way_with_nothing_to_compare_with_fails_the_run() -> None:
    alone = [r for r in rows() if r.way == "dispatch"]
    assert judge(alone) == ["dispatch: nothing that trains the same data to compare with"]


def test_every_round_has_its_own_reference() -> None:
    first, second = rows(), rows(dispatch={"losses": [5.005, 4.805]})
    problems = judge(first + [replace(r, repeat=1) for r in second])
    assert problems == [
        "dispatch: losses [5.005, 4.805] vs zero3's [5.005, 4.905]: relative difference 2.0e-02 > 1e-04 "
        "(round 2, ep 2)"
    ]
