"""Shrink a config class's own defaults into a tiny model of the same architecture, by field name.

Pure dict-to-dict rules (no transformers import): widths, heads and KV heads, 4 experts top-2, vocabulary, MLA ranks,
linear-attention and Mamba heads, vision and audio towers; per-layer lists keep every kind of layer; head sizes keep
their defaults so that rotary sections still fit. `generate.py` builds, runs and saves what these rules produce.
"""

from __future__ import annotations

import json
from typing import Any


# Head dimensions keep their defaults: rotary sections, partial rotary factors and MLA splits are sized for them.
# Fields set outright (a default larger than these, or any default for the ratios that must match).
_WIDTH = {
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 128,
    "max_position_embeddings": 128,
    # expert widths
    "moe_intermediate_size": 16,
    "moe_hidden_size": 16,
    "expert_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
    "shared_experts_intermediate_size": 16,
    "moe_shared_expert_intermediate_size": 16,
    "shared_intermediate_size": 16,
    "dense_intermediate_size": 32,
    "share_expert_dim": 16,
    "router_hidden_size": 16,
    "projector_hidden_size": 32,
    # per-layer input embeddings (gemma4)
    "vocab_size_per_layer_input": 128,
    "hidden_size_per_layer_input": 8,
    # multi-head latent attention (DeepSeek V2/V3 family); q_lora_rank None stays None
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "o_lora_rank": 16,
    # sparse-attention indexers
    "index_n_heads": 2,
    "index_topk": 4,
    # linear attention / gated delta net
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_num_heads": 2,
    # state-space layers
    "mamba_n_heads": 8,
    "mamba_num_heads": 8,
    "mamba_d_state": 8,
    "ssm_state_size": 8,
    "mamba_dt_rank": 4,
    "mamba_chunk_size": 16,
    "chunk_size": 16,
    "n_groups": 1,
    # sliding-window attention
    "sliding_window": 8,
    "sliding_window_size": 8,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 4,
    "num_sliding_attention_heads": 4,
}
# Expert counts: 4 experts divide over 2 and 4 EP ranks; 2 per token; groups of the router collapse to one.
_EXPERTS = {"num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4}
_TOP_K = {"num_experts_per_tok": 2, "moe_k": 2, "num_experts_per_token": 2, "moe_topk": 2, "top_k_experts": 2}
_GROUPS = {"n_group": 1, "topk_group": 1, "num_expert_group": 1}
# Fields that say where the dense layers end and MoE begins: every layer of the tiny model may be MoE.
_FIRST_MOE = {"first_k_dense_replace": 0, "moe_layer_start_index": 0, "num_dense_layers": 0, "decoder_sparse_step": 1}
_VISION = {
    # audio towers
    "d_model": 32,
    "encoder_layers": 1,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "output_dim": 32,
    "depth": 1,
    "num_heads": 2,
    "embed_dim": 32,
    "out_hidden_size": 32,
    "num_layers": 1,
}
_NONE_MEANS_OFF = ("q_lora_rank", "sliding_window", "sliding_window_size", "o_lora_rank")
# Fields a config class leaves None by default although its model reads them (a real checkpoint's config sets them):
# without these its default config builds no model on stock 5.23.0 either. Keyed by the (sub-)config's model_type;
# where the model reads each one is in docs/architectures.md.
_UNSET_DEFAULTS: dict[str, dict[str, Any]] = {
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # modeling_lfm2_moe.py:472
    "qwen4_exp_text": {  # modeling_qwen4_exp.py:679-681
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 256,  # the rotary dimension must fit in it
        "indexer_budget": 8,
        "indexer_compress_ratio": 2,
    },
    "deepseek_ocr2_text": {"mlp_layer_types": ["sparse", "sparse"]},  # modeling_deepseek_ocr2.py:1249
    "step3p5": {"sliding_window": 8},  # masking_utils.py:1206
    # no head_dim: hidden_size // num_attention_heads = 4096 // 96 is not its rotary head (modeling_glm4v_moe.py:116)
    "glm4v_moe_text": {"head_dim": 128},
    "qwen3_omni_moe_talker_text": {"shared_expert_intermediate_size": 16},  # read as an attribute, never set
    # every default layer is a Mamba layer, and a forward with a cache of Mamba layers only fails (cache_utils.py:1723)
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
}
# Tiny values one model type needs beyond the rules, applied after them, each with its reason.
_TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    # its sliding-window layers double the KV heads (modeling_mimo_v2_flash.py:341): 8 heads keep a query group each
    "mimo_v2_flash": {"num_attention_heads": 8},
}
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id")


def _slides(config: dict[str, Any]) -> bool:
    return any("sliding" in json.dumps(v) for v in config.values() if isinstance(v, list))


def _layer_lists(config: dict[str, Any], layers: int) -> dict[str, list[Any]]:
    """Per-layer lists (`layer_types`, `mlp_layer_types`, ...): those as long as the layer count."""
    return {k: v for k, v in config.items() if isinstance(v, list) and len(v) == layers and layers > 1}


def _tiny_layer_count(config: dict[str, Any], at_least: int) -> int:
    """The shortest prefix of the layers that keeps every kind of layer the per-layer lists name."""
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int):
        return at_least
    lists = _layer_lists(config, layers)
    count = at_least
    for values in lists.values():
        kinds = {json.dumps(v) for v in values}
        seen: set[str] = set()
        for index, value in enumerate(values):
            seen.add(json.dumps(value))
            if seen == kinds:
                count = max(count, index + 1)
                break
    return min(count, layers)


# key -> (tiny value, whether a None default is replaced too: None means "derive it" for most fields, which some
# models cannot, but "not used" for a few)
_SET: dict[str, tuple[int, bool]] = (
    {key: (value, key not in _NONE_MEANS_OFF) for key, value in _WIDTH.items()}
    | {key: (value, True) for key, value in (_EXPERTS | _GROUPS).items()}  # None too: gemma4 leaves MoE off
    | {key: (value, False) for key, value in _FIRST_MOE.items()}
    | {"text_hidden_size": (_WIDTH["hidden_size"], False), "out_hidden_size": (_WIDTH["hidden_size"], False)}
    | {"index_kpool": (2, False), "num_layers": (1, False), "depth": (1, False)}
)


def _tiny_value(key: str, value: Any, *, is_sub_config: bool, slides: bool, layers: int) -> Any:
    """The tiny value of one integer field (`value` itself where no rule names it)."""
    if isinstance(value, list) and key in ("hidden_sizes", "depths") and all(isinstance(v, int) for v in value):
        return [32 if key == "hidden_sizes" else 1] * len(value)  # staged towers (muse_spark's audio encoder)
    if isinstance(value, bool):
        return True if key.startswith(("enable_moe", "use_moe")) else value  # gemma4 ships its MoE block off
    if not (value is None or isinstance(value, int)):
        return value
    if key == "num_hidden_layers":
        return layers
    if key in _TOP_K:  # top-1 routers stay top-1
        return min(value or _TOP_K[key], _TOP_K[key])
    if key == "n_shared_experts":  # None: some models multiply by it (dots1)
        return 1 if value is None else min(value, 1)
    rules = _SET | ({key: (tiny, False) for key, tiny in _VISION.items()} if is_sub_config else {})
    if key not in rules:
        return value
    tiny, none_too = rules[key]
    if value is None and not (none_too or (key == "sliding_window" and slides)):
        return value
    return tiny


def _fit_token_ids(out: dict[str, Any]) -> None:
    """Special token ids inside the tiny vocabulary (an embedding's `padding_idx` must be)."""
    vocab = out.get("vocab_size")
    if not isinstance(vocab, int):
        return
    for key in _TOKEN_IDS:
        value = out.get(key)
        if isinstance(value, int) and value >= vocab:
            out[key] = vocab - 1 - _TOKEN_IDS.index(key)
        elif isinstance(value, list):
            out[key] = [v if v < vocab else vocab - 1 for v in value]


def shrink(config: dict[str, Any], *, layers: int = 2, is_sub_config: bool = False) -> dict[str, Any]:
    """The default config `config` (a `to_dict()`) with every field that sizes the model made tiny."""
    config = config | _UNSET_DEFAULTS.get(config.get("model_type", ""), {})
    old_layers = config.get("num_hidden_layers")
    new_layers = _tiny_layer_count(config, layers)
    slides = _slides(config)
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key == "per_layer_config" and isinstance(value, dict):
            # heterogeneous layers keyed by index: keep (shrunk) the ones the tiny model still has
            out[key] = {k: shrink(v, layers=layers) for k, v in value.items() if int(k) < new_layers}
        elif isinstance(value, dict) and ("model_type" in value or key.endswith("_config")):
            out[key] = shrink(value, layers=layers, is_sub_config=True)
        else:
            out[key] = _tiny_value(key, value, is_sub_config=is_sub_config, slides=slides, layers=new_layers)
    _keep_derived_head_dim(config, out)
    if isinstance(old_layers, int):
        for key in _layer_lists(config, old_layers):
            out[key] = out[key][:new_layers]
    _fit_token_ids(out)
    _match_inner_widths(out)
    _match_text_width(out)
    return out | _TINY_OVERRIDES.get(str(config.get("model_type", "")), {})


def _keep_derived_head_dim(config: dict[str, Any], out: dict[str, Any]) -> None:
    """A model that derives its head size (`hidden_size // num_attention_heads`) keeps the default one: rotary
    sections and partial rotary factors are sized for it. The tiny model widens to 4 such heads instead."""
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if config.get("head_dim") is not None or not (isinstance(hidden, int) and isinstance(heads, int) and heads):
        return
    # a default that does not divide (qwen3_omni_moe: 2048 / 28) has no consistent head: take a common one, 64
    head = hidden // heads if hidden % heads == 0 else 64
    out["hidden_size"] = out["num_attention_heads"] * head
    if "head_dim" in config:  # None, read as `getattr(config, "head_dim", hidden // heads)`, which None defeats
        out["head_dim"] = head


def _match_inner_widths(out: dict[str, Any]) -> None:
    """Widths the config validates against its own hidden size: an adapter's input, a Mamba mixer's heads."""
    hidden = out.get("hidden_size")
    if not isinstance(hidden, int):
        return
    for key in ("adapter_in_dim", "adapter_input_size"):
        if isinstance(out.get(key), int):
            out[key] = hidden
    heads, expand = out.get("mamba_n_heads"), out.get("mamba_expand")
    if isinstance(heads, int) and isinstance(expand, int) and isinstance(out.get("mamba_d_head"), int):
        out["mamba_d_head"] = expand * hidden // heads  # heads x head size = the mixer's inner width


def _match_text_width(out: dict[str, Any]) -> None:
    """Towers that project into the text model (`out_hidden_size`, `text_hidden_size`) follow its tiny width."""
    text = out.get("text_config")
    if not isinstance(text, dict) or not isinstance(text.get("hidden_size"), int):
        return
    for value in out.values():
        if isinstance(value, dict) and value is not text:
            for key in ("out_hidden_size", "text_hidden_size", "adapter_out_dim"):
                if isinstance(value.get(key), int):
                    value[key] = text["hidden_size"]
