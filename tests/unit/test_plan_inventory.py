"""The inventory from real transformers configs, built on the meta device (no weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadpolicy.plan.cost import Device, Launch, predict
from loadpolicy.plan.inventory import inventory_from_config
from loadpolicy.shape import EPLayout, LaunchShape


pytestmark = pytest.mark.live
GIB = 1024**3


def test_inventory_counts_every_parameter_once_and_finds_the_experts(tmp_path: Path) -> None:
    import torch
    import transformers

    config = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        tie_word_embeddings=True,
    )  # fmt: skip
    (tmp_path / "config.json").write_text(config.to_json_string(), encoding="utf-8")
    inventory = inventory_from_config(tmp_path)  # from a directory holding config.json, as users pass it
    with torch.device("meta"):
        model = transformers.Qwen3MoeForCausalLM(config)
    assert inventory.parameters == sum(p.numel() for p in model.parameters())  # the tied head counted once
    experts = {e.name for e in inventory.entries if e.expert}
    assert experts == {f"model.layers.{i}.mlp.experts.{p}" for i in (0, 1) for p in ("gate_up_proj", "down_proj")}
    split = {e.name.split(".")[-2] for e in inventory.entries if e.tp_split}
    assert {"q_proj", "k_proj", "v_proj", "o_proj"} <= split
    assert not any(e.tp_split for e in inventory.entries if "norm" in e.name or ".gate." in e.name)
    assert inventory.num_experts == 4


def test_qwen3_30b_a3b_at_ep4_holds_what_pr_45548_reported() -> None:
    """PR #45548 measured about 16.4 GiB per rank at EP=4: 2.87 GiB replicated + 13.5 GiB of experts."""
    from loadpolicy.plan.configs import published_config

    inventory = inventory_from_config(published_config("Qwen3-30B-A3B"))
    # PR #45548 reads dense weights whole: the EPMeta load without partition reads
    shape = LaunchShape(4, True, EPLayout.TP_EQUALS_EP, flat_partitions=False)
    (cost,) = predict(Launch(shape, Device.GPU), inventory).ranks
    assert inventory.dense_bytes / GIB == pytest.approx(2.87, abs=0.01)
    assert (cost.held.nbytes - inventory.dense_bytes) / GIB == pytest.approx(13.5, abs=0.01)
    assert json.loads(inventory.to_json())["num_experts"] == 128
