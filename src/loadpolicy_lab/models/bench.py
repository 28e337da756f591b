"""The benchmark's checkpoints: MoE at about 300M and 850M parameters and dense models of about 300M and 1B, bf16.

Built from config classes with random weights and written by `save_pretrained` (safetensors, the architecture's real
on-disk format: per-expert keys that loading merges), so loading does the work a real checkpoint needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadpolicy_lab.models.architectures import Architecture


_BASE = {
    "vocab_size": 32000,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
# Smoke sizes (CI): the same shapes of model, small enough to build and load in seconds.
_SMOKE = _BASE | {"vocab_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16}


BenchModel = Architecture


def _moe(name: str, base: dict[str, Any], **sizes: int) -> BenchModel:
    config = base | {"num_experts_per_tok": 2, "intermediate_size": 2048} | sizes
    return BenchModel(name, "Qwen3MoeConfig", "Qwen3MoeForCausalLM", config)


def _dense(name: str, base: dict[str, Any], **sizes: int) -> BenchModel:
    return BenchModel(name, "LlamaConfig", "LlamaForCausalLM", base | sizes, moe=False)


FULL = (
    _moe("moe-300m", _BASE, hidden_size=1024, num_hidden_layers=8, num_experts=16, moe_intermediate_size=512),
    _moe("moe-850m", _BASE, hidden_size=1024, num_hidden_layers=12, num_experts=32, moe_intermediate_size=640),
    _dense("dense-300m", _BASE, hidden_size=1024, num_hidden_layers=14, intermediate_size=4096),
    # how peak and time grow with size: 3.5x dense-300m's bytes, same layout
    _dense("dense-1b", _BASE, hidden_size=2048, num_hidden_layers=16, intermediate_size=8192),
)
SMOKE = (
    _moe("moe-smoke", _SMOKE, hidden_size=64, num_hidden_layers=2, num_experts=8, moe_intermediate_size=64),
    _dense("dense-smoke", _SMOKE, hidden_size=64, num_hidden_layers=2, intermediate_size=256),
)


def build(model: BenchModel, directory: Path) -> Path:
    """Save `model` in bf16 under `directory/name` (reused when already there); return the path."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    path = directory / model.name
    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    config = model.transformers_config()
    with torch.device("cpu"):
        built = getattr(transformers, model.model_class)(config).to(torch.bfloat16)
    built.save_pretrained(path, safe_serialization=True)
    return path
