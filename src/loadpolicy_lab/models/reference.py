"""The independent reference of the load matrix: each checkpoint loaded in one process by the stock tree.

Every rank of a matrix run compares its distributed load with this file: the gathered (or local) parameters tensor by
tensor, and the logits. It is written once per checkpoint by `python -m loadpolicy_lab.models.reference` run on the
stock tree, never by the code under test, so a conversion bug shared by the patched tree's one-process and
distributed loads still fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def reference_path(checkpoints: Path, arch: str, bnb_8bit: bool) -> Path:
    """Where the reference of `checkpoints/arch` (loaded in 8 bits or not) is kept."""
    return checkpoints / "references" / f"{arch}{'-bnb8' if bnb_8bit else ''}.pt"


def load_reference(path: Path) -> dict[str, Any]:
    import torch  # noqa: PLC0415  # only where tensors are compared

    reference: dict[str, Any] = torch.load(path, weights_only=True)
    return reference


def input_ids() -> Any:
    """The 12 tokens every matrix load runs forward on."""
    import torch  # noqa: PLC0415

    return torch.arange(12).reshape(2, 6) % 64


def model_output(output: Any) -> Any:
    """What a load is judged on: the logits, or the last hidden state of a model without a head."""
    logits = getattr(output, "logits", None)
    return output.last_hidden_state if logits is None else logits


def _load_one(checkpoints: Path, arch: str, bnb_8bit: bool, model_class_name: str) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if bnb_8bit:
        kwargs["quantization_config"] = transformers.BitsAndBytesConfig(load_in_8bit=True)
    model_class = getattr(transformers, model_class_name)
    model = model_class.from_pretrained(checkpoints / arch, **kwargs)
    with torch.no_grad():
        logits = model_output(model(input_ids=input_ids()))
    # .data: a plain tensor also for bitsandbytes' Int8Params, so the file loads with weights_only=True
    params = {n: p.data.detach().cpu().clone() for n, p in model.named_parameters()}
    return {"logits": logits, "params": params, "transformers_file": transformers.__file__}


def main(spec_path: str) -> None:
    import torch  # noqa: PLC0415

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    for case in spec["cases"]:
        torch.manual_seed(0)
        loaded = _load_one(Path(spec["checkpoints"]), case["arch"], case["bnb_8bit"], case["model_class"])
        torch.save(loaded, case["out"])


if __name__ == "__main__":
    main(sys.argv[1])
