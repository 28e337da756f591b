"""The validation matrix and the judge, on synthetic rank results (the real runs are `tox -e multigpu`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from loadpolicy_lab.harness.launch import Launcher, Tree, accelerate_config
from loadpolicy_lab.matrix.cases import SCENARIOS, STOCK_DEVICE_MAP_ERROR, Run, Scenario, fast_matrix, full_matrix
from loadpolicy_lab.matrix.judge import judge
from loadpolicy_lab.matrix.run import RunOutcome
from loadpolicy_lab.validate.report import is_unexpected, render_table, rows


def test_fast_matrix_covers_every_scenario_on_both_trees_at_two_ranks() -> None:
    runs = fast_matrix()
    assert {(r.scenario, r.tree) for r in runs} == {(s, t) for s in Scenario for t in Tree}
    assert all(r.ranks == 2 for r in runs)
    assert any(r.launcher is Launcher.ACCELERATE and r.scenario is Scenario.EP_ZERO3 for r in runs)


def test_the_sweep_has_two_and_four_ranks_on_both_trees_and_accelerate_for_every_zero3_scenario() -> None:
    runs = full_matrix(sweep=True)
    for scenario, spec in SCENARIOS.items():
        for tree in Tree:
            torchrun = {
                r.ranks for r in runs if (r.scenario, r.tree, r.launcher) == (scenario, tree, Launcher.TORCHRUN)
            }
            assert torchrun == {2, 4}
            accelerate = {
                r.ranks for r in runs if (r.scenario, r.tree, r.launcher) == (scenario, tree, Launcher.ACCELERATE)
            }
            if scenario in (Scenario.EP_ZERO3, Scenario.COMPOSITE_EP_ZERO3):
                assert accelerate == {2, 4}
            else:
                assert accelerate == ({2} if spec.zero3 else set())


def test_the_main_job_runs_each_behaviour_once_where_it_can_differ() -> None:
    runs = full_matrix()
    assert set(runs) <= set(full_matrix(sweep=True))
    patched = {(r.scenario, r.launcher, r.ranks) for r in runs if r.tree is Tree.PATCHED}
    # every scenario on the patched tree at 2 ranks; at 4 where the width changes what a rank owns and reads
    assert {s for s, launcher, ranks in patched if (launcher, ranks) == (Launcher.TORCHRUN, 2)} == set(Scenario)
    at_four = {s for s, launcher, ranks in patched if (launcher, ranks) == (Launcher.TORCHRUN, 4)}
    assert at_four == {
        Scenario.EP_ZERO3,
        Scenario.COMPOSITE_EP_ZERO3,
        Scenario.EP_ZERO3_DISPATCH,
        Scenario.MOE_ZERO3,
    }
    through_accelerate = {(s, ranks) for s, launcher, ranks in patched if launcher is Launcher.ACCELERATE}
    assert (Scenario.EP_ZERO3, 4) in through_accelerate
    assert {s for s, _ in through_accelerate} >= {Scenario.EP_ZERO3, Scenario.EP_ZERO3_DISPATCH, Scenario.DENSE_ZERO3}
    # the stock tree once for the bug (each scenario it must fail stops at the same gate) and once for what it keeps
    stock = [r for r in runs if r.tree is Tree.STOCK]
    assert all((r.launcher, r.ranks) == (Launcher.TORCHRUN, 2) for r in stock)
    assert {r.scenario for r in stock} == {Scenario.EP_ZERO3, Scenario.DENSE_ZERO3}
    assert SCENARIOS[Scenario.EP_ZERO3].stock_fails
    assert not SCENARIOS[Scenario.DENSE_ZERO3].stock_fails


def good_ep_result(rank: int) -> dict[str, Any]:
    return {
        "policy": "EPMeta",
        "missing_keys": [],
        "unexpected_keys": [],
        "mismatched_keys": [],
        "on_meta": [],
        "loading_branch": "zero3_read_partitions",
        "partitioned": 10,
        "parameters": 10,
        "experts": {
            "model.layers.0.mlp.experts.gate_up_proj": {"local": [2, 16, 16], "full": [4, 16, 16], "equal": True}
        },
        "dense_unequal": [],
        "max_abs_diff": 3e-8,
        "saved_unequal": [],
    }


EP_RUN = Run(Scenario.EP_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
BUG = {"error": f"ValueError: {STOCK_DEVICE_MAP_ERROR}."}


def ranks_with(change: dict[str, Any] | None = None, rank: int = 1) -> list[dict[str, Any] | None]:
    results: list[dict[str, Any] | None] = [{"results": {"qwen3_moe": good_ep_result(r)}} for r in range(2)]
    if change is not None:
        target = results[rank]
        assert target is not None
        target["results"]["qwen3_moe"].update(copy.deepcopy(change))
    return results


def test_judge_passes_a_correct_ep_load() -> None:
    outcome = judge(EP_RUN, "qwen3_moe", ranks_with())
    assert outcome.passed, outcome.detail


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"policy": "MetaShardOnRead"}, "ranks chose different policies"),
        ({"on_meta": ["model.rotary_emb.inv_freq"]}, "left on meta"),
        ({"missing_keys": ["lm_head.weight"]}, "missing_keys"),
        ({"experts": {"e": {"local": [4, 16, 16], "full": [4, 16, 16], "equal": True}}}, "local shape"),
        ({"experts": {"e": {"local": [2, 16, 16], "full": [4, 16, 16], "equal": False}}}, "not this rank's slice"),
        ({"experts": {}}, "no expert parameters"),
        ({"max_abs_diff": 1e-3}, "logits differ"),
        ({"max_abs_diff": float("nan")}, "logits differ from the stock one-process load by nan"),
        ({"dense_unequal": ["model.embed_tokens.weight"]}, "parameters outside the experts differ"),
        ({"loading_branch": "shard_on_read"}, "loading branch shard_on_read, expected zero3_read_partitions"),
        ({"partitioned": 6}, "only 6/10 parameters partitioned"),
        (
            {"saved_unequal": ["model.layers.0.mlp.experts.3.up_proj.weight"]},
            "saved tensors differ from the checkpoint",
        ),
        ({"error": "ValueError: boom"}, "rank 1: ValueError: boom"),
    ],
)
def test_judge_fails_and_says_which_rank_and_why(change: dict[str, Any], needle: str) -> None:
    outcome = judge(EP_RUN, "qwen3_moe", ranks_with(change))
    assert not outcome.passed
    assert needle in outcome.detail


@pytest.mark.parametrize("field", ["dense_unequal", "max_abs_diff", "saved_unequal"])
def test_a_missing_figure_fails(field: str) -> None:
    results = ranks_with()
    target = results[1]
    assert target is not None
    del target["results"]["qwen3_moe"][field]
    outcome = judge(EP_RUN, "qwen3_moe", results)
    assert not outcome.passed
    assert "rank 1" in outcome.detail


def test_zero3_gathered_values_must_have_been_compared() -> None:
    run = Run(Scenario.MOE_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
    result = good_ep_result(0) | {"policy": "Zero3Init", "partitioned": 10, "gathered_unequal": []}
    result["loading_branch"] = "zero3_read_partitions"
    del result["experts"], result["dense_unequal"]
    assert judge(run, "qwen3_moe", [{"results": {"qwen3_moe": dict(result)}} for _ in range(2)]).passed
    unequal = result | {"gathered_unequal": ["model.layers.0.mlp.experts.gate_up_proj"]}
    outcome = judge(run, "qwen3_moe", [{"results": {"qwen3_moe": dict(unequal)}} for _ in range(2)])
    assert "gathered values differ" in outcome.detail
    del result["gathered_unequal"]
    outcome = judge(run, "qwen3_moe", [{"results": {"qwen3_moe": dict(result)}} for _ in range(2)])
    assert not outcome.passed
    assert "no 'gathered_unequal'" in outcome.detail


@pytest.mark.parametrize("branch", ["zero3_gather_and_copy", None])
def test_patched_dense_zero3_must_have_read_partitions(branch: str | None) -> None:
    run = Run(Scenario.DENSE_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
    result = good_ep_result(0) | {"policy": "Zero3Init", "partitioned": 10, "gathered_unequal": []}
    result["loading_branch"] = branch
    del result["experts"], result["dense_unequal"]
    outcome = judge(run, "qwen3_moe", [{"results": {"qwen3_moe": dict(result)}} for _ in range(2)])
    assert not outcome.passed
    assert f"loading branch {branch}, expected zero3_read_partitions" in outcome.detail


def test_a_rank_without_result_fails() -> None:
    results = ranks_with()
    results[1] = None
    outcome = judge(EP_RUN, "qwen3_moe", results)
    assert not outcome.passed
    assert "rank 1: no result" in outcome.detail


def test_refusal_must_reach_every_rank() -> None:
    run = Run(Scenario.REFUSED_ZERO3_FSDP, Tree.PATCHED, Launcher.TORCHRUN, 2)
    refusal = SCENARIOS[Scenario.REFUSED_ZERO3_FSDP].refusal
    assert refusal is not None
    both = [{"results": {"qwen3_moe": {"error": f"ValueError: x {refusal}2"}}} for _ in range(2)]
    assert judge(run, "qwen3_moe", list(both)).passed
    one = [both[0], {"results": {"qwen3_moe": {"error": "RuntimeError: something else"}}}]
    outcome = judge(run, "qwen3_moe", list(one))
    assert not outcome.passed
    assert "ranks [1]" in outcome.detail


def test_stock_expected_failure_and_unexpected_pass() -> None:
    stock = Run(Scenario.EP_ZERO3, Tree.STOCK, Launcher.TORCHRUN, 2)
    failing = judge(stock, "qwen3_moe", [ranks_with(BUG, r)[r] for r in range(2)])
    assert RunOutcome(stock, 1.0, (failing,)).met_expectation
    # A stock load that passes every check where stock must fail is reported (the matrix would be wrong).
    clean: list[dict[str, Any] | None] = [
        {"results": {"qwen3_moe": good_ep_result(r) | {"policy": None}}} for r in range(2)
    ]
    passing = judge(stock, "qwen3_moe", clean)
    assert not passing.failed_as_expected
    assert "did not fail with" in passing.detail
    assert is_unexpected(RunOutcome(stock, 1.0, (passing,)))


@pytest.mark.parametrize(
    "other_failure",
    [{"error": "ImportError: cannot import name 'x'"}, {"error": "RuntimeError: harness crashed"}],
)
def test_stock_failure_must_be_the_known_bug_on_every_rank(other_failure: dict[str, Any]) -> None:
    stock = Run(Scenario.EP_ZERO3, Tree.STOCK, Launcher.TORCHRUN, 2)
    results = [ranks_with(BUG, 0)[0], ranks_with(other_failure, 1)[1]]
    outcome = RunOutcome(stock, 1.0, (judge(stock, "qwen3_moe", results),))
    assert not outcome.met_expectation
    assert is_unexpected(outcome)
    assert "ranks [1] did not fail with" in outcome.archs[0].detail
    # the right failures, but the launch timed out: not the bug either
    both = [ranks_with(BUG, r)[r] for r in range(2)]
    timed_out = RunOutcome(stock, 1.0, (judge(stock, "qwen3_moe", both),), launch_error="timed out after 180s")
    assert not timed_out.met_expectation


def test_stock_failing_where_it_must_pass_fails_the_command() -> None:
    stock = Run(Scenario.PLAIN_EP, Tree.STOCK, Launcher.TORCHRUN, 2)
    failing = judge(stock, "qwen3_moe", ranks_with({"error": "RuntimeError: broken"}))
    assert is_unexpected(RunOutcome(stock, 1.0, (failing,)))


def test_table_puts_stock_and_patched_side_by_side() -> None:
    stock = Run(Scenario.EP_ZERO3, Tree.STOCK, Launcher.TORCHRUN, 2)
    outcomes = [
        RunOutcome(stock, 2.0, (judge(stock, "qwen3_moe", [ranks_with(BUG, r)[r] for r in range(2)]),)),
        RunOutcome(EP_RUN, 3.0, (judge(EP_RUN, "qwen3_moe", ranks_with()),)),
    ]
    (row,) = rows(outcomes)
    assert row["stock"] == "FAIL"
    assert row["patched"] == "pass"
    assert "EP under ZeRO-3" in render_table(outcomes)


def test_accelerate_config_is_deepspeed_zero3(tmp_path: Path) -> None:
    text = accelerate_config(tmp_path / "a.yaml", 4, 29500, on_cpu=True).read_text(encoding="utf-8")
    assert "distributed_type: DEEPSPEED" in text
    assert "zero_stage: 3" in text
    assert "num_processes: 4" in text


def test_quantized_zero3_must_have_quantized_parameters() -> None:
    run = Run(Scenario.QUANTIZED_ZERO3, Tree.STOCK, Launcher.TORCHRUN, 2)
    result = good_ep_result(0) | {"policy": None, "experts": {}, "quantized_8bit": 0}
    outcome = judge(run, "llama", [{"results": {"llama": dict(result)}} for _ in range(2)])
    assert "no parameter was quantized to 8 bits" in outcome.detail
    result["quantized_8bit"] = 7
    outcome = judge(run, "llama", [{"results": {"llama": dict(result)}} for _ in range(2)])
    assert outcome.passed, outcome.detail
