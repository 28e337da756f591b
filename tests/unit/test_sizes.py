"""`normalise_sizes` mirrors transformers' DistributedConfig; the live test checks that against the real class."""

from __future__ import annotations

import itertools
import os
import warnings

import pytest

from loadpolicy.policy import LoadPolicyError, ParallelSizes
from loadpolicy.sizes import RawSizes, normalise_sizes


def test_defaults_are_all_one() -> None:
    assert normalise_sizes(RawSizes()).sizes == ParallelSizes()


def test_enable_expert_parallel_alone_is_a_silent_no_op_made_loud() -> None:
    result = normalise_sizes(RawSizes(enable_expert_parallel=True))
    assert result.sizes.ep == 1
    assert not result.sizes.expert_parallel
    assert "expert parallelism is OFF" in result.warnings[0]
    assert "DistributedConfig(tp_size=N, ep_size=N)" in result.warnings[0]


def test_enable_expert_parallel_with_tp_means_ep_equals_tp() -> None:
    result = normalise_sizes(RawSizes(tp_size=4, enable_expert_parallel=True))
    assert result.sizes.ep == 4
    assert "ep_size=4" in result.warnings[0]


def test_tp_plan_derives_tp_from_world_size() -> None:
    assert normalise_sizes(RawSizes(tp_plan_given=True, fsdp_size=2), world_size=8).sizes.tp == 4
    with pytest.raises(LoadPolicyError, match=r"WORLD_SIZE \(6\) must be divisible"):
        normalise_sizes(RawSizes(tp_plan_given=True, fsdp_size=4), world_size=6)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (RawSizes(tp_size=2, ep_size=3), "must be a multiple of `tp_size`"),
        (RawSizes(tp_size=2, ep_size=4), "must divide `fsdp_size * tp_size` (1 * 2)"),
        (RawSizes(fsdp_size=2, pp_size=2), "pipeline parallelism (pp_size=2)"),
        (RawSizes(ep_size=0), "`ep_size` must be an integer >= 1 or unset, got 0"),
    ],
)
def test_invalid_layouts(raw: RawSizes, needle: str) -> None:
    with pytest.raises(LoadPolicyError) as excinfo:
        normalise_sizes(raw)
    assert needle in str(excinfo.value)


SIZE_CHOICES = [None, 1, 2, 4]


@pytest.mark.live
def test_matches_transformers_distributed_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every small layout normalises to what transformers 5.23.0 computes, or both refuse it."""
    from transformers.distributed import configuration_utils  # required: a moved API must fail, not skip

    monkeypatch.setenv("WORLD_SIZE", "8")
    checked = 0
    for tp, ep, fsdp, pp, eep, plan in itertools.product(
        SIZE_CHOICES, SIZE_CHOICES, [None, 1, 2], [None, 1, 2], [False, True], [False, True]
    ):
        raw = RawSizes(
            tp_size=tp, ep_size=ep, fsdp_size=fsdp, pp_size=pp, enable_expert_parallel=eep, tp_plan_given=plan
        )
        try:
            ours: ParallelSizes | None = normalise_sizes(raw, world_size=int(os.environ["WORLD_SIZE"])).sizes
        except LoadPolicyError:
            ours = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                config = configuration_utils.DistributedConfig(
                    tp_size=tp,
                    ep_size=ep,
                    fsdp_size=fsdp,
                    pp_size=pp,
                    enable_expert_parallel=eep,
                    tp_plan={} if plan else None,
                )
            except ValueError:
                theirs = None
            else:
                theirs = ParallelSizes(
                    tp=config.tp_size,
                    ep=config.ep_size,
                    fsdp=config.fsdp_size,
                    pp=config.pp_size,
                    dp_replicate=config.dp_replicate_size,
                )
        assert ours == theirs, f"{raw}: ours {ours}, transformers {theirs}"
        checked += 1
    assert checked == 4 * 4 * 3 * 3 * 2 * 2
