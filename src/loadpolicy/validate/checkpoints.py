"""Build and save the tiny checkpoints (float32, safetensors, the architecture's own on-disk format)."""

from __future__ import annotations

from pathlib import Path

from loadpolicy.validate.models import ARCHITECTURES


def build_checkpoint(model_type: str, directory: Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny `model_type` to `directory/model_type` (reused when already there)."""
    import torch
    import transformers

    arch = ARCHITECTURES[model_type]
    path = directory / model_type
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    config = getattr(transformers, arch.config_class)(**arch.config)
    model = getattr(transformers, arch.model_class)(config)
    model.save_pretrained(path, safe_serialization=True)
    return path
