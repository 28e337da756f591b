"""The training-step judge at width (`perf.step`): what passes, what fails, and the reference it judges against."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest


torch = pytest.importorskip("torch")

from loadpolicy_lab.perf.step import (  # noqa: E402
    LEARNING_RATE,
    SAMPLES,
    judge_step,
    positions,
    reach_problems,
    reference_step,
    rows_of,
)


EXPERTS = "model.layers.0.mlp.experts.gate_up_proj"
DENSE = "model.layers.0.self_attn.q_proj.weight"


def _reference(bf16_error: float = 1e-3) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    grads = {name: torch.randn(64, generator=generator) for name in (EXPERTS, DENSE)}
    return {
        "positions": {name: torch.arange(64) for name in grads},
        "weights": {name: torch.randn(64, generator=generator) for name in grads},
        "grads": grads,
        "bf16_grads": {name: g + bf16_error * torch.randn(64, generator=generator) for name, g in grads.items()},
        "loss": 2.0,
        "bf16_loss": 2.001,
        "experts": [EXPERTS],
        "learning_rate": LEARNING_RATE,
    }


def _ranks(reference: dict[str, Any], grads: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Two ranks, each holding half of every parameter's positions, with the step they took from `grads`."""
    grads = grads or reference["grads"]
    ranks: list[dict[str, Any]] = [{}, {}]
    for name, grad in grads.items():
        weight = reference["weights"][name].double() - reference["learning_rate"] * grad.double()
        for rank, part in enumerate((slice(0, 32), slice(32, 64))):
            index = list(range(64))[part]
            ranks[rank][name] = {"index": index, "grad": grad[part].tolist(), "weight": weight[part].tolist()}
    return ranks


def test_the_one_process_float32_step_split_over_two_ranks_passes() -> None:
    reference = _reference()
    verdict = judge_step(reference, [2.0, 2.0], _ranks(reference))
    assert verdict.problems == ()
    assert verdict.judged == 2
    assert verdict.grad_ratio == 0.0
    assert verdict.weight_ratio <= 1.0
    assert verdict.reach > 1.0


def test_a_halved_expert_gradient_fails_by_name() -> None:
    reference = _reference()
    grads = dict(reference["grads"]) | {EXPERTS: reference["grads"][EXPERTS] * 0.5}
    verdict = judge_step(reference, [2.0, 2.0], _ranks(reference, grads))
    assert verdict.grad_worst == EXPERTS
    assert any(p.startswith(f"{EXPERTS}: grad root mean square error") for p in verdict.problems)
    assert any(p.startswith(f"{EXPERTS}: weight root mean square error") for p in verdict.problems)


def test_a_step_within_twice_bf16_s_error_passes_and_beyond_it_fails() -> None:
    reference = _reference()
    noise = torch.randn(64, generator=torch.Generator().manual_seed(1))
    bound = 2.0 * float((reference["bf16_grads"][DENSE] - reference["grads"][DENSE]).pow(2).mean().sqrt())
    for scale, passes in ((0.9, True), (1.1, False)):
        off = reference["grads"][DENSE] + scale * bound * noise / float(noise.pow(2).mean().sqrt())
        verdict = judge_step(reference, [2.0], _ranks(reference, dict(reference["grads"]) | {DENSE: off}))
        assert (verdict.problems == ()) is passes, (scale, verdict.problems)


def test_nan_a_position_no_rank_or_two_ranks_hold_and_a_missing_parameter_fail() -> None:
    reference = _reference()
    ranks = _ranks(reference)
    ranks[0][DENSE]["grad"][0] = math.nan
    verdict = judge_step(reference, [2.0], ranks)
    assert any(p.startswith(f"{DENSE}: grad") for p in verdict.problems)
    assert verdict.grad_ratio == math.inf

    ranks = _ranks(reference)
    ranks[1][DENSE] = {key: values[1:] for key, values in ranks[1][DENSE].items()}  # position 32: no rank
    ranks[0][EXPERTS]["index"][0] = 40  # position 40: both ranks, position 0: none
    problems = judge_step(reference, [2.0], ranks).problems
    assert f"{DENSE}: 1 of 64 positions not held by one rank" in problems
    assert f"{EXPERTS}: 2 of 64 positions not held by one rank" in problems

    ranks = _ranks(reference)
    del ranks[0][DENSE], ranks[1][DENSE]
    ranks[0]["model.extra"] = ranks[0][EXPERTS]
    problems = judge_step(reference, [2.0], ranks).problems
    assert f"{DENSE}: no rank reports it" in problems
    assert "model.extra: not in the reference" in problems


def test_a_nan_or_missing_loss_and_a_reference_that_cannot_see_its_experts_fail() -> None:
    reference = _reference()
    assert "the ranks' loss is nan (1 reported)" in judge_step(reference, [math.nan], _ranks(reference)).problems
    assert "the ranks' loss is nan (0 reported)" in judge_step(reference, [], _ranks(reference)).problems
    blind = _reference(bf16_error=1.0)
    assert (
        f"the reference cannot tell a halved expert gradient: {[EXPERTS]}"
        in judge_step(blind, [2.0], _ranks(blind)).problems
    )
    assert (
        "the reference cannot tell a halved expert gradient: none"
        in judge_step(reference | {"experts": []}, [2.0], _ranks(reference)).problems
    )


def test_a_reference_whose_bf16_error_hides_a_halved_expert_gradient_is_refused() -> None:
    assert reach_problems(_reference(bf16_error=1e-3)) == []
    assert reach_problems(_reference(bf16_error=1.0)) == [EXPERTS]


def test_rows_split_over_replicas_and_an_unequal_split_is_refused() -> None:
    ids = torch.arange(8).reshape(4, 2)
    assert [rows_of(ids, rank, 2, 2).tolist() for rank in range(2)] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert all(torch.equal(rows_of(ids, rank, 2, 1), ids) for rank in range(2))  # one tp = ep group: all rows
    with pytest.raises(ValueError, match="4 sequences over 3 replicas of 3 ranks"):
        rows_of(ids, 0, 3, 3)


def test_positions_are_every_element_of_a_small_parameter_and_a_fixed_draw_of_a_large_one() -> None:
    assert torch.equal(positions("norm.weight", torch.ones(10)), torch.arange(10))
    grad = torch.zeros(1000, 1000)
    grad[7] = 1.0  # one row with a gradient: an embedding whose batch has one token
    drawn = positions("embed_tokens.weight", grad)
    assert torch.equal(drawn, positions("embed_tokens.weight", grad))
    assert not torch.equal(drawn, positions("lm_head.weight", grad))
    assert 0 < len(drawn) <= SAMPLES
    assert bool((drawn[1:] > drawn[:-1]).all())
    in_the_row = int(((drawn >= 7000) & (drawn < 8000)).sum())
    assert in_the_row > SAMPLES // 4  # half the draws, less their repeats, where the step moves the weights
    assert len(positions("embed_tokens.weight", torch.zeros(1000, 1000))) > SAMPLES // 4  # no gradient: uniform


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_reference_steps_a_tiny_moe_in_float32_and_bf16(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from loadpolicy_lab.models.architectures import ARCHITECTURES

    config = ARCHITECTURES["mixtral"].transformers_config()
    config.initializer_range = 0.3  # experts that matter beside bf16's rounding (test_logits.py)
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(config).save_pretrained(tmp_path)
    reference = reference_step(tmp_path, "MixtralForCausalLM")
    model = transformers.MixtralForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    assert set(reference["positions"]) == set(params)
    assert reference["experts"]
    assert all(".experts." in name for name in reference["experts"])
    for name, chosen in reference["positions"].items():  # the bf16 weights, widened
        assert torch.equal(reference["weights"][name], params[name].detach().reshape(-1)[chosen].float())
    assert all(bool(g.abs().sum() > 0) for n, g in reference["grads"].items() if "embed" not in n)
    assert reference["loss"] != reference["bf16_loss"]
    assert judge_step(reference, [reference["loss"]], [_whole(reference)]).problems == ()


def _whole(reference: dict[str, Any]) -> dict[str, Any]:
    """One rank holding every position, with the reference's own float32 step."""
    return {
        name: {
            "index": list(range(len(chosen))),
            "grad": reference["grads"][name].tolist(),
            "weight": (reference["weights"][name] - reference["learning_rate"] * reference["grads"][name]).tolist(),
        }
        for name, chosen in reference["positions"].items()
    }
