"""The tiny-config generator's shrinking rules, and the architectures table's judgement (pure logic, no torch)."""

from __future__ import annotations

from typing import Any, ClassVar

from loadpolicy_lab.harness.launch import Launcher, Tree
from loadpolicy_lab.harness.rank import raised_at
from loadpolicy_lab.matrix.cases import Run, Scenario
from loadpolicy_lab.matrix.judge import ArchOutcome
from loadpolicy_lab.matrix.run import RunOutcome
from loadpolicy_lab.models.generate import _declares_ep_plan
from loadpolicy_lab.models.shrink import shrink
from loadpolicy_lab.validate.architectures import COLUMNS, table_rows


def _moe(**extra: Any) -> dict[str, Any]:
    return {
        "model_type": "toy_moe",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "vocab_size": 151936,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "q_lora_rank": None,
        "pad_token_id": 151643,
        "eos_token_id": [151645, 3],
        "use_cache": True,
    } | extra


def test_widths_and_experts_shrink_and_head_dims_keep_their_defaults() -> None:
    tiny = shrink(_moe())
    assert (tiny["hidden_size"], tiny["intermediate_size"], tiny["moe_intermediate_size"]) == (32, 32, 16)
    assert (tiny["num_attention_heads"], tiny["num_key_value_heads"]) == (4, 4)  # TP over 4 ranks needs 4 KV heads
    assert (tiny["num_experts"], tiny["num_experts_per_tok"], tiny["num_hidden_layers"]) == (4, 2, 2)
    assert tiny["head_dim"] == 128  # rotary sections and MLA splits are sized for it
    assert tiny["q_lora_rank"] is None  # None means "no query LoRA", not "derive it"
    assert tiny["use_cache"] is True


def test_token_ids_fit_the_tiny_vocabulary() -> None:
    tiny = shrink(_moe())
    assert tiny["pad_token_id"] < tiny["vocab_size"]
    assert all(i < tiny["vocab_size"] for i in tiny["eos_token_id"])
    assert 3 in tiny["eos_token_id"]


def test_a_top_1_router_stays_top_1_and_unset_expert_fields_are_filled() -> None:
    tiny = shrink(_moe(num_experts_per_tok=1, n_group=None, topk_group=None, num_experts=None))
    assert tiny["num_experts_per_tok"] == 1
    assert (tiny["n_group"], tiny["topk_group"], tiny["num_experts"]) == (1, 1, 4)


def test_per_layer_lists_keep_every_kind_of_layer() -> None:
    kinds = ["linear_attention"] * 3 + ["full_attention"]
    tiny = shrink(_moe(layer_types=kinds * 12, mlp_only_layers=[]))
    assert tiny["num_hidden_layers"] == 4
    assert tiny["layer_types"] == kinds
    assert tiny["mlp_only_layers"] == []


def test_sliding_window_is_set_where_a_layer_slides_and_left_off_otherwise() -> None:
    sliding = shrink(_moe(sliding_window=None, layer_types=["sliding_attention", "full_attention"] * 24))
    assert sliding["sliding_window"] == 8
    assert shrink(_moe(sliding_window=None))["sliding_window"] is None
    assert shrink(_moe(sliding_window=4096))["sliding_window"] == 8


def test_per_layer_overrides_keep_only_the_tiny_models_layers_and_shrink() -> None:
    tiny = shrink(_moe(per_layer_config={"01": {"num_attention_heads": 64}, "17": {"head_dim": 512}}))
    assert tiny["per_layer_config"] == {"01": {"num_attention_heads": 4}}


def test_sub_configs_shrink_with_the_vision_rules_and_dense_layers_collapse() -> None:
    composite = {
        "model_type": "toy_vl_moe",
        "text_config": _moe(first_k_dense_replace=3, model_type="toy_vl_moe_text"),
        "vision_config": {"model_type": "toy_vision", "depth": 27, "hidden_size": 1152, "out_hidden_size": 4096},
    }
    tiny = shrink(composite)
    assert tiny["text_config"]["first_k_dense_replace"] == 0
    assert tiny["text_config"]["num_experts"] == 4
    assert tiny["vision_config"] == {"model_type": "toy_vision", "depth": 1, "hidden_size": 32, "out_hidden_size": 32}


def test_a_derived_head_size_keeps_its_default_and_towers_follow_the_text_width() -> None:
    tiny = shrink(_moe(head_dim=None))  # 4096 // 32: rotary sections are sized for 128
    assert (tiny["head_dim"], tiny["hidden_size"], tiny["num_attention_heads"]) == (128, 512, 4)
    unset = {k: v for k, v in _moe().items() if k != "head_dim"}
    assert shrink(unset)["hidden_size"] == 512
    assert "head_dim" not in shrink(unset)
    composite = {"text_config": unset, "vision_config": {"model_type": "v", "out_hidden_size": 4096}}
    assert shrink(composite)["vision_config"]["out_hidden_size"] == 512


def test_a_moe_block_switched_off_by_default_is_switched_on() -> None:
    assert shrink(_moe(enable_moe_block=False))["enable_moe_block"] is True
    assert shrink(_moe(n_shared_experts=None, tie_word_embeddings=False))["n_shared_experts"] == 1
    assert shrink(_moe(tie_word_embeddings=False))["tie_word_embeddings"] is False


def _outcome(scenario: Scenario, tree: Tree, ranks: int, *results: ArchOutcome) -> RunOutcome:
    return RunOutcome(Run(scenario, tree, Launcher.TORCHRUN, ranks, archs=("a", "b")), 1.0, results)


def test_the_table_counts_a_type_only_when_every_patched_column_passes() -> None:
    outcomes = []
    for scenario, tree in COLUMNS:
        for ranks in (2, 4):
            if tree is Tree.STOCK and scenario is Scenario.EP_ZERO3:
                results = (ArchOutcome("a", False, "bug", failed_as_expected=True), ArchOutcome("b", False, "bug"))
            elif tree is Tree.PATCHED and scenario is Scenario.EP_ZERO3_DISPATCH and ranks == 4:
                results = (ArchOutcome("a", True, "ok"), ArchOutcome("b", False, "rank 1: boom"))
            else:
                results = (ArchOutcome("a", True, "ok"), ArchOutcome("b", True, "ok"))
            outcomes.append(_outcome(scenario, tree, ranks, *results))
    manifest = {
        "a": {"built": True, "model_class": "A"},
        "b": {"built": True, "model_class": "B"},
        "c": {"built": False, "error": "ValueError: x", "where": "m.py:1"},
    }
    rows = {row["model_type"]: row for row in table_rows(manifest, outcomes)}
    assert rows["a"]["patched_all"]
    assert rows["a"]["plain_ep_stock"]
    assert rows["b"]["plain_ep_stock"]
    assert not rows["b"]["patched_all"]
    assert "token dispatch | patched x4: rank 1: boom" in rows["b"]["cause"]
    # stock must fail *with the bug*: b's stock failure was something else
    assert not rows["b"]["cells"]["EP under ZeRO-3 | stock x2"]["ok"]
    assert rows["c"]["cause"] == "not generated: ValueError: x (m.py:1)"
    assert not rows["c"]["patched_all"]


def test_a_failure_names_the_innermost_transformers_frame() -> None:
    tail = (
        'File "/x/trees/stock/src/transformers/modeling_utils.py", line 4438, in from_pretrained\n'
        'File "/x/trees/stock/src/transformers/models/glm5_next/modeling_glm5_next.py", line 210, in forward\n'
        'File "/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward\n'
    )
    assert raised_at(tail) == "transformers/models/glm5_next/modeling_glm5_next.py:210"
    assert raised_at("") == ""


def test_named_model_types_get_the_defaults_their_class_lacks_and_their_overrides() -> None:
    lfm2 = shrink(_moe(model_type="lfm2_moe", layer_types=None))
    assert lfm2["layer_types"] == ["conv", "full_attention"]
    assert shrink(_moe(model_type="mimo_v2_flash"))["num_attention_heads"] == 8  # its SWA layers double the KV heads
    assert shrink(_moe())["num_attention_heads"] == 4


def test_an_ep_plan_nested_in_a_sub_config_of_a_sub_config_counts() -> None:
    class Text:
        base_model_ep_plan: ClassVar = {"layers.*.mlp.experts": "ep_dispatch_experts"}

    class Thinker:
        sub_configs: ClassVar = {"text_config": Text}

    class Omni:
        sub_configs: ClassVar = {"thinker_config": Thinker, "code2wav_config": object}

    assert _declares_ep_plan(Omni)
    assert not _declares_ep_plan(object)
