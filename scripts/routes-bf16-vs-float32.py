"""How many tokens a bf16 one-process forward routes otherwise than the float32 one, layer by layer, and how far its
logits land: why the logits judge (`loadpolicy_lab.bench.logits`) bounds a root mean square, not the largest difference.

    python scripts/routes-bf16-vs-float32.py CHECKPOINT MODEL_CLASS

Run on the stock tree (transformers 5.23.0), e.g. `build/widths/checkpoints/qwen3-30b-a3b Qwen3MoeForCausalLM`, on
the judge's prompt (`bench.logits.prompt`). Hooks read each router's top-k indices: the last output of the modules
named `*.gate` or `*.router`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import transformers

from loadpolicy_lab.bench.logits import forward_logits, prompt


def _forward(checkpoint: Path, model_class: str, dtype: torch.dtype) -> tuple[Any, list[tuple[str, Any]]]:
    """The logits and every router's top-k indices, in the order the routers ran."""
    model = getattr(transformers, model_class).from_pretrained(checkpoint, dtype=dtype)
    routes: list[tuple[str, Any]] = []

    def record(name: str) -> Any:
        def hook(module: Any, inputs: Any, output: Any) -> None:
            if isinstance(output, tuple):
                routes.append((name, output[-1].detach().clone()))

        return hook

    for name, module in model.named_modules():
        if name.endswith((".gate", ".router")):
            module.register_forward_hook(record(name))
    logits = forward_logits(model, prompt(model.config.get_text_config().vocab_size))
    return logits, routes


def main(checkpoint: Path, model_class: str) -> None:
    exact, exact_routes = _forward(checkpoint, model_class, torch.float32)
    rounded, rounded_routes = _forward(checkpoint, model_class, torch.bfloat16)
    difference = rounded - exact
    print(f"largest |bf16 - float32| logit difference: {float(difference.abs().max()):.4f}")
    print(f"root mean square: {float(difference.square().mean().sqrt()):.4f}")
    for (name, first), (_, second) in zip(exact_routes, rounded_routes, strict=True):
        other = (first.sort(-1).values != second.sort(-1).values).any(-1)
        print(f"{name}: {int(other.sum())} of {other.numel()} tokens routed otherwise in bf16")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
