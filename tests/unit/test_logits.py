"""The logits judge of loads at real widths (`perf.logits`): on tensors, and on a real tiny MoE's forwards."""

from __future__ import annotations

import math
from pathlib import Path
from unittest import mock

import pytest

from loadpolicy_lab.perf.logits import REFERENCE_NAME, judge, judge_agreement, reference_logits
from loadpolicy_lab.perf.logits_rank import judge_logits


torch = pytest.importorskip("torch")


def _reference() -> dict[str, object]:
    exact = torch.linspace(-4.0, 4.0, 4 * 25).reshape(4, 25)
    one_process = exact.clone()
    one_process[1, :] += 0.5  # bf16's own error at this width: root mean square 0.25
    return {"one_process": one_process.to(torch.bfloat16), "float32": exact}


def test_logits_within_twice_bf16_s_own_error_pass_and_beyond_it_fail() -> None:
    reference = _reference()
    exact, one_process = reference["float32"], reference["one_process"].float()  # type: ignore[attr-defined]
    verdict = judge(one_process, reference)
    assert (verdict.problem, verdict.from_one_process) == (None, 0.0)
    assert verdict.error == pytest.approx(0.25, rel=1e-3)  # the reference is rounded to bf16
    assert verdict.bound == pytest.approx(0.5, rel=1e-3)
    elsewhere = exact.clone()
    elsewhere[2, :] -= 0.5  # the same error on another token: a flipped route
    verdict = judge(elsewhere, reference)
    assert verdict.problem is None
    assert verdict.from_one_process == pytest.approx(0.5, rel=1e-2)
    wrong = exact.clone()
    wrong[:2, :] += 0.75  # half the tokens off by more than bf16 moves them: root mean square 0.53
    verdict = judge(wrong, reference)
    assert verdict.problem is not None
    assert "logits 0.5303 (root mean square) from the float32 forward's, over 2x" in verdict.problem
    assert "(0.5001)" in verdict.problem


def test_nan_logits_a_nan_reference_and_another_shape_fail() -> None:
    reference = _reference()
    nan = reference["one_process"].float()  # type: ignore[attr-defined]
    nan[0, 0] = math.nan
    assert judge(nan, reference).problem is not None
    broken = {**reference, "float32": torch.full((4, 25), math.nan)}
    assert judge(reference["one_process"].float(), broken).problem is not None  # type: ignore[attr-defined]
    verdict = judge(torch.zeros(4, 24), reference)
    assert verdict.problem == "logits of shape (4, 24), expected (4, 25)"
    assert math.isnan(verdict.error)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Mixtral whose experts matter to its logits: at transformers' std 0.02 and width 16 they barely do, and
    bf16's own error hides them; at the published widths they dominate (`dev perf widths`)."""
    transformers = pytest.importorskip("transformers")
    from loadpolicy_lab.models.architectures import ARCHITECTURES

    config = ARCHITECTURES["mixtral"].transformers_config()
    config.initializer_range = 0.3
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("checkpoints") / "mixtral"
    transformers.MixtralForCausalLM(config).save_pretrained(path)
    return path


def test_ranks_that_disagree_beyond_the_bound_fail() -> None:
    first = torch.zeros(4, 25)
    assert judge_agreement(first.clone(), first, 0.1) == (0.0, None)
    apart = first.clone()
    apart[0, :] = 0.4  # root mean square 0.2
    difference, problem = judge_agreement(apart, first, 0.1)
    assert difference == pytest.approx(0.2)
    assert problem == "logits 0.2 (root mean square) from rank 0's, over the bound (0.1)"
    nan = first.clone()
    nan[1, 1] = math.nan
    assert judge_agreement(nan, first, 0.1)[1] is not None


def test_a_forward_missing_half_the_experts_fails_in_the_worker_and_the_stock_one_passes(
    tiny_moe: Path, tmp_path: Path
) -> None:
    """What an unreduced partial sum looks like (a rank's experts only): the worker's judge must report it; a second
    stock bf16 load must pass with no difference at all."""
    import transformers

    from loadpolicy_lab.harness.rank import Rank

    reference = tmp_path / REFERENCE_NAME
    torch.save(reference_logits(tiny_moe, "MixtralForCausalLM"), reference)
    model = transformers.MixtralForCausalLM.from_pretrained(tiny_moe, dtype=torch.bfloat16)
    vocab_size = model.config.vocab_size
    figures = judge_logits(Rank(tmp_path), reference, model, vocab_size)
    assert figures["logits_problems"] == []
    assert figures["logits_from_one_process"] == 0.0
    assert figures["logits_from_rank0"] is None  # one rank: nothing to agree with
    experts = model.model.layers[0].mlp.experts
    with torch.no_grad():
        experts.down_proj[experts.down_proj.shape[0] // 2 :] = 0.0
    figures = judge_logits(Rank(tmp_path), reference, model, vocab_size)
    assert len(figures["logits_problems"]) == 1
    assert "(root mean square) from the float32 forward's, over 2x" in figures["logits_problems"][0]
    assert figures["logits_error"] > figures["logits_bound"]  # type: ignore[operator]


def test_the_reference_records_the_judge_s_reach_and_refuses_a_model_whose_experts_it_cannot_see(
    tiny_moe: Path, tmp_path: Path
) -> None:
    reference = reference_logits(tiny_moe, "MixtralForCausalLM")
    verdict = judge(reference["one_process"].float(), reference)
    assert verdict.half_the_experts > verdict.bound
    from loadpolicy_lab.models.checkpoints import build_checkpoint

    # transformers' own std 0.02 at width 16: the experts' outputs are below bf16's rounding of the logits
    faint = build_checkpoint("mixtral", tmp_path)
    with pytest.raises(ValueError, match="cannot judge this model's experts"):
        reference_logits(faint, "MixtralForCausalLM")


def test_a_forward_the_ranks_here_cannot_hold_is_not_judged_and_says_why(tiny_moe: Path, tmp_path: Path) -> None:
    """The ZeRO-3 forward gathers each module whole on every rank: where the ranks on this machine cannot hold the
    largest twice, the judge says so instead of the OOM killer ending the launch."""
    import transformers

    from loadpolicy_lab.harness.rank import Rank
    from loadpolicy_lab.perf import logits_rank

    model = transformers.MixtralForCausalLM.from_pretrained(tiny_moe, dtype=torch.bfloat16)
    experts = model.model.layers[0].mlp.experts
    for param in experts.parameters(recurse=False):
        param.ds_numel = param.numel()  # as ZeRO-3 marks a partitioned parameter
    gathered = sum(p.numel() * 2 for p in experts.parameters(recurse=False))
    assert logits_rank.largest_gather(model) == gathered
    four_ranks_here = mock.patch.dict("os.environ", {"LOCAL_WORLD_SIZE": "4"})
    with four_ranks_here, mock.patch.object(logits_rank, "_available", return_value=2 * gathered * 4 - 1):
        figures = judge_logits(Rank(tmp_path), tmp_path / "unused.pt", model, model.config.vocab_size)
    assert figures["logits_error"] is None
    assert figures["logits_problems"] == []
    assert figures["logits_not_judged"] is not None
    assert "2 copies on each of 4 ranks here" in figures["logits_not_judged"]
    with four_ranks_here, mock.patch.object(logits_rank, "_available", return_value=2 * gathered * 4):
        assert logits_rank.forward_does_not_fit(model) is None
