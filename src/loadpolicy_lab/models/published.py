"""Checkpoints shaped like the published MoE models: their config.json at full width, full expert count and real
vocabulary, truncated to a few layers, bf16, written Hub-style (several safetensors files and an index).

The configs are the Hub's (no hub access here: copied field by field); only `num_hidden_layers` (and the per-layer
lists that follow it) is cut, and gpt-oss's MXFP4 `quantization_config` dropped (its experts unquantized, as the
published bf16 conversions ship them). What each shape exercises: docs/benchmark.md ("Real widths").
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loadpolicy.errors import CommandError
from loadpolicy.units import GIB
from loadpolicy_lab.models.architectures import Architecture


@dataclass(frozen=True, slots=True)
class WidthShape:
    """A published model's shape, cut to `architecture.config['num_hidden_layers']` layers."""

    architecture: Architecture
    source: str  # the Hub repository whose config.json this copies
    layers_published: int
    shard_size: str = "1GB"  # Hub checkpoints use 4-5 GB; 1 GB splits these few layers into as many files

    @property
    def name(self) -> str:
        return self.architecture.name

    def identity(self) -> str:
        """What the cached checkpoint was built from: a changed config rebuilds it."""
        arch = self.architecture
        return json.dumps({"class": arch.model_class, "config": arch.config, "shard": self.shard_size}, sort_keys=True)


_QWEN3_30B_A3B = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}
_MIXTRAL_8X7B = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
}
_DEEPSEEK_V2_LITE = {
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,  # layer 0 dense, every later layer MoE
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": False,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
_GPT_OSS_20B = {
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "swiglu_limit": 7.0,
    "attention_bias": True,
    "tie_word_embeddings": False,
}

SHAPES = (
    WidthShape(
        Architecture(
            "qwen3-30b-a3b", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", _QWEN3_30B_A3B | {"num_hidden_layers": 2}
        ),
        "Qwen/Qwen3-30B-A3B",
        48,
    ),
    WidthShape(
        Architecture("mixtral-8x7b", "MixtralConfig", "MixtralForCausalLM", _MIXTRAL_8X7B | {"num_hidden_layers": 1}),
        "mistralai/Mixtral-8x7B-v0.1",
        32,
    ),
    WidthShape(
        Architecture(
            "deepseek-v2-lite",
            "DeepseekV2Config",
            "DeepseekV2ForCausalLM",
            _DEEPSEEK_V2_LITE | {"num_hidden_layers": 3},
        ),
        "deepseek-ai/DeepSeek-V2-Lite",
        27,
    ),
    WidthShape(
        Architecture(
            "gpt-oss-20b",
            "GptOssConfig",
            "GptOssForCausalLM",
            _GPT_OSS_20B | {"num_hidden_layers": 1, "layer_types": ["sliding_attention"]},
        ),
        "openai/gpt-oss-20b",
        24,
    ),
)
SHAPES_BY_NAME = {shape.name: shape for shape in SHAPES}


def with_layers(shape: WidthShape, layers: int) -> WidthShape:
    """`shape` cut to its first `layers` layers (its per-layer list cut alike), named for it; as it is where it has
    no more."""
    config = shape.architecture.config
    if layers >= config["num_hidden_layers"]:
        return shape
    cut = config | {"num_hidden_layers": layers}
    if "layer_types" in config:
        cut["layer_types"] = config["layer_types"][:layers]
    return replace(shape, architecture=replace(shape.architecture, name=f"{shape.name}-{layers}l", config=cut))


class SizeGuardError(CommandError):
    """A checkpoint would not fit under the size limit or on the disk."""


def _meta_model(shape: WidthShape) -> Any:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    config = shape.architecture.transformers_config()
    with torch.device("meta"):
        return getattr(transformers, shape.architecture.model_class)._from_config(config, dtype=torch.bfloat16)


def checkpoint_bytes(shape: WidthShape) -> int:
    """Bytes of the shape's parameters in bf16, from a model built on the meta device (nothing allocated)."""
    model = _meta_model(shape)
    return sum(math.prod(p.shape) * p.element_size() for p in model.parameters())


def _guard(shape: WidthShape, directory: Path, nbytes: int, max_gib: float) -> None:
    if nbytes > max_gib * GIB:
        raise SizeGuardError(
            f"{shape.name} is {nbytes / GIB:.2f} GiB, over --max-gib {max_gib}: raise the limit or cut its layers"
        )
    free = shutil.disk_usage(directory).free
    if free < nbytes + 2 * GIB:  # the checkpoint and room for the system to go on
        raise SizeGuardError(
            f"{shape.name} needs {nbytes / GIB:.2f} GiB and {directory} has {free / GIB:.2f} GiB free (2 GiB kept)"
        )


def build(shape: WidthShape, directory: Path, *, max_gib: float) -> Path:
    """Write `shape` under `directory/name` with transformers' own initialisation (std 0.02, norms at 1: bf16 logits
    stay small), sharded at `shape.shard_size` with an index; reused while its identity file matches."""
    import torch  # noqa: PLC0415

    path = directory / shape.name
    identity = path / "loadpolicy-shape.json"
    if identity.exists() and identity.read_text(encoding="utf-8") == shape.identity():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    model = _meta_model(shape)
    _guard(shape, directory, sum(math.prod(p.shape) * p.element_size() for p in model.parameters()), max_gib)
    torch.manual_seed(0)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.initialize_weights()
    partial = directory / f".{shape.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, max_shard_size=shape.shard_size)
    del model
    if not (partial / "model.safetensors.index.json").exists():
        raise SizeGuardError(f"{shape.name} was written as one file: lower its shard size ({shape.shard_size})")
    partial.rename(path)
    identity.write_text(shape.identity(), encoding="utf-8")
    return path
