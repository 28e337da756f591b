"""The live adapter reads transformers' real global state (no mocks): HfDeepSpeedConfig, DistributedConfig."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadpolicy.live import explain_live, live_inputs, rank_prefix
from loadpolicy.policy import EPMeta, MetaShardOnRead, ParallelSizes, Zero3Init


pytestmark = pytest.mark.live


@pytest.fixture
def zero3() -> Iterator[object]:
    from transformers.integrations import deepspeed  # required (the live marker skips without transformers)

    config = deepspeed.HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_batch_size": 2})
    try:
        yield config
    finally:
        deepspeed.unset_hf_deepspeed_config()


def test_no_deepspeed_config_means_meta_shard_on_read() -> None:
    inputs = live_inputs()
    assert not inputs.zero3_enabled
    assert inputs.sizes == ParallelSizes()
    assert explain_live().policy == MetaShardOnRead()


def test_hf_deepspeed_config_makes_zero3_init(zero3: object) -> None:
    assert live_inputs().zero3_enabled
    assert explain_live().policy == Zero3Init()


def test_distributed_config_with_ep_under_zero3_is_ep_meta(zero3: object) -> None:
    from transformers import DistributedConfig

    config = DistributedConfig(tp_size=2, ep_size=2)
    explanation = explain_live(config)
    assert explanation.policy == EPMeta(ep_size=2)
    assert explanation.inputs.sizes == ParallelSizes(tp=2, ep=2)


def test_enable_expert_parallel_alone_stays_zero3_init(zero3: object) -> None:
    from transformers import DistributedConfig

    with pytest.warns(FutureWarning):
        config = DistributedConfig(enable_expert_parallel=True)
    assert explain_live(config).policy == Zero3Init()


def test_rank_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert rank_prefix() == ""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rank_prefix() == "[rank 1/2] "


def test_sizes_that_do_not_span_the_launch_are_refused(zero3: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import DistributedConfig

    from loadpolicy.policy import LoadPolicyError

    monkeypatch.setenv("WORLD_SIZE", "2")
    config = DistributedConfig(fsdp_size=4, ep_size=2)
    with pytest.raises(LoadPolicyError, match=r"= 4 ranks, but this launch has 2"):
        explain_live(config)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert explain_live(config).policy == EPMeta(ep_size=2)
