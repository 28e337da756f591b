"""Published hyperparameters of the MoE models our users load, for projecting loading costs without their weights.

Values are those of each model's `config.json` on the Hugging Face hub (fields that do not change parameter counts,
such as rope scaling, are left at transformers' defaults). Projections load in bfloat16: DeepSeek-V3's hub checkpoint
is float8 with block scales, so its bf16 figures are those of its bf16 conversion.
"""

from __future__ import annotations

from typing import Any

from loadpolicy.plan.inventory import config_from_dict


# The fields both Qwen3-MoE releases share; each adds its own widths and depth.
_QWEN3_MOE: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
}
PUBLISHED: dict[str, dict[str, Any]] = {
    # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
    "Qwen3-30B-A3B": _QWEN3_MOE
    | {"hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48}
    | {"num_attention_heads": 32},
    # https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json
    "Qwen3-235B-A22B": _QWEN3_MOE
    | {"hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 94}
    | {"num_attention_heads": 64},
    # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (the multi-token-prediction layer,
    # `num_nextn_predict_layers`, is not part of transformers' model and is not loaded)
    "DeepSeek-V3": {
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 3,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "tie_word_embeddings": False,
    },
}


def published_config(name: str) -> Any:
    """The transformers config object of a published model (needs the `live` extra)."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(PUBLISHED)}")
    return config_from_dict(PUBLISHED[name])
