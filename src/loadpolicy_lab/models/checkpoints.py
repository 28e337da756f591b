"""Build and save the tiny checkpoints (float32, safetensors, the architecture's own on-disk format), and the stock
tree's one-process load of each, the reference every distributed load is judged against."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from loadpolicy_lab.harness.launch import run_bounded, tree_env
from loadpolicy_lab.models.architectures import ARCHITECTURES
from loadpolicy_lab.models.architectures import model_classes as known_model_classes
from loadpolicy_lab.models.reference import load_reference, reference_path


def build_checkpoint(model_type: str, directory: Path, seed: int = 0) -> Path:
    """Save a randomly initialised tiny `model_type` to `directory/model_type` (reused when already there)."""
    import torch
    import transformers

    arch = ARCHITECTURES[model_type]
    path = directory / model_type
    if (path / "config.json").exists():
        return path
    torch.manual_seed(seed)
    config = arch.transformers_config()
    model = getattr(transformers, arch.model_class)(config)
    model.save_pretrained(path, safe_serialization=True)
    return path


def build_references(
    cases: set[tuple[str, bool]],
    checkpoints: Path,
    stock: Path,
    timeout: float,
    model_classes: dict[str, str] | None = None,
) -> None:
    """Load every (arch, bnb_8bit) in one process on the stock tree and save its logits and parameters.

    `model_classes` names the class of generated architectures (`generate.py`); the others are in ARCHITECTURES."""
    classes = known_model_classes(model_classes)
    references = reference_path(checkpoints, "", bnb_8bit=False).parent
    references.mkdir(parents=True, exist_ok=True)
    spec = {
        "cases": [
            {
                "arch": arch,
                "bnb_8bit": bnb,
                "model_class": classes[arch],
                "out": str(reference_path(checkpoints, arch, bnb)),
            }
            for arch, bnb in sorted(cases)
        ],
        "checkpoints": str(checkpoints.resolve()),
    }
    (references / "spec.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
    command = [sys.executable, "-m", "loadpolicy_lab.models.reference", str(references / "spec.json")]
    code = run_bounded(command, tree_env(stock), references / "reference.log", timeout)
    if code != 0:
        log = (references / "reference.log").read_text(encoding="utf-8")[-2000:]
        raise RuntimeError(f"the stock one-process reference load exited {code}:\n{log}")
    stock_src = stock.resolve() / "src"
    for arch, bnb in cases:
        imported = load_reference(reference_path(checkpoints, arch, bnb))["transformers_file"]
        if not Path(imported).is_relative_to(stock_src):
            raise RuntimeError(f"the reference of {arch} imported transformers from {imported}, not {stock_src}")
