"""Tiny models of every validated architecture, built from transformers config classes (no hub).

Sizes are the smallest that load under EP at 2 and 4 ranks: 4 experts (divisible by 2 and 4), 4 KV heads (TP=4
needs at least 4), one MoE layer. `save_pretrained` writes the architecture's real on-disk format, so loading runs the
same weight conversions (per-expert keys merged into `gate_up_proj`, mixtral's renames) as a real checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadpolicy_lab.models.shrink import shrink


_ATTENTION = {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 4}
_COMMON = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1, "max_position_embeddings": 64}


@dataclass(frozen=True, slots=True)
class Architecture:
    """A model the project builds from a transformers config class (a tiny one here, the bench's larger ones)."""

    name: str
    config_class: str
    model_class: str
    config: dict[str, Any]
    moe: bool = True
    # the config class's own defaults shrunk by `shrink.shrink` (then `config` on top), not written out here
    generated: bool = False

    def transformers_config(self, **overrides: Any) -> Any:
        """The model's transformers config object (needs the `live` extra)."""
        import transformers  # noqa: PLC0415  # the `live` extra

        config_class = getattr(transformers, self.config_class)
        if not self.generated:
            return config_class(**(self.config | overrides))
        return config_class.from_dict(shrink(config_class().to_dict()) | self.config | overrides)


ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Architecture(
            "qwen3_moe",
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            _COMMON
            | _ATTENTION
            | {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "intermediate_size": 32},
        ),
        Architecture(
            "mixtral",
            "MixtralConfig",
            "MixtralForCausalLM",
            _COMMON | _ATTENTION | {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8},
        ),
        Architecture(
            "gpt_oss",
            "GptOssConfig",
            "GptOssForCausalLM",
            _COMMON
            | _ATTENTION
            | {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8, "sliding_window": 8},
        ),
        Architecture(
            "deepseek_v3",
            "DeepseekV3Config",
            "DeepseekV3ForCausalLM",
            _COMMON
            | {
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "n_shared_experts": 1,
                "n_group": 1,
                "topk_group": 1,
                "first_k_dense_replace": 0,
                "moe_intermediate_size": 8,
                "intermediate_size": 32,
                "q_lora_rank": None,
                "kv_lora_rank": 8,
                "qk_nope_head_dim": 4,
                "qk_rope_head_dim": 4,
                "v_head_dim": 4,
            },
        ),
        Architecture(
            "qwen2_moe",
            "Qwen2MoeConfig",
            "Qwen2MoeForCausalLM",
            _COMMON
            | _ATTENTION
            | {
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 8,
                "shared_expert_intermediate_size": 8,
                "intermediate_size": 32,
            },
        ),
        Architecture(
            "olmoe",
            "OlmoeConfig",
            "OlmoeForCausalLM",
            _COMMON
            | {"num_attention_heads": 4, "num_key_value_heads": 4}
            | {"num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 8},
        ),
        Architecture(
            "glm4v_moe",
            "Glm4vMoeConfig",
            "Glm4vMoeForConditionalGeneration",
            {
                "text_config": _COMMON
                | {
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 4,
                    "head_dim": 4,
                    "intermediate_size": 32,
                    "moe_intermediate_size": 8,
                    "num_experts_per_tok": 2,
                    "n_routed_experts": 4,
                    "n_shared_experts": 1,
                    "first_k_dense_replace": 1,
                    "rope_parameters": {
                        "rope_type": "default",
                        "rope_theta": 10000.0,
                        "mrope_section": [1, 0, 1],
                        "partial_rotary_factor": 1.0,
                    },
                },
                "vision_config": {
                    "depth": 1,
                    "hidden_size": 16,
                    "num_heads": 2,
                    "intermediate_size": 32,
                    "out_hidden_size": 16,
                },
            },
        ),
        # Its EP plan also shards the dense `mlp` beside the experts (`colwise`/`rowwise`): EP under ZeRO-3 must leave
        # that MLP whole to ZeRO-3 (the EP PR). Generated from Gemma4TextConfig's defaults, MoE block switched on.
        Architecture("gemma4_text", "Gemma4TextConfig", "Gemma4ForCausalLM", {}, generated=True),
        # Its experts go through `Transpose(1, 2, check_dims=True)`: under EP a checkpoint in the model's layout was
        # transposed on stock (the sharded-transpose PR). Composite, generated; plain EP fails on stock, so it runs
        # where stock must fail anyway: composite EP under ZeRO-3.
        Architecture("qwen3_vl_moe", "Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", {}, generated=True),
        Architecture(
            "llama",
            "LlamaConfig",
            "LlamaForCausalLM",
            _COMMON | _ATTENTION | {"intermediate_size": 32},
            moe=False,
        ),
    )
}


def model_classes(generated: dict[str, str] | None = None) -> dict[str, str]:
    """The class each checkpoint loads with: the matrix's architectures, then `generated` (generate.py's manifest)."""
    return {name: arch.model_class for name, arch in ARCHITECTURES.items()} | (generated or {})
