"""Whether a loaded model computes the checkpoint's function: its logits on a fixed prompt against the stock tree's
one-process forwards, at real widths.

The reference comes from one process on the stock tree, once per checkpoint (`python -m loadpolicy_lab.perf.logits`):
the logits of a bf16 load, as users run it, and those of a float32 load (the bf16 weights widened exactly), the
forward the weights define up to float32's rounding. The root mean square of their difference over every logit is
what bf16 compute itself costs at this width on this prompt: roundings, and the few tokens that take other experts
because rounding moved a router's inputs. A sharded bf16 forward makes roundings of the same kind and number in
another order (each rank's experts summed by a collective, tokens dispatched), so its distance from the float32
forward is of the same size: it must stay within BOUND_FACTOR times the one-process forward's. The root mean square
is stable where a maximum is not: a token whose route a rounding flips moves its logits by an expert's share, in the
sharded forward and in the one-process one alike, but on other tokens. A missing or misplaced expert, a partial sum
left unreduced or tokens returned to the wrong place move every token they touch by a whole expert's output. Weights
are judged elsewhere (exactly, by `perf.fingerprint`); this judges the sharded forward that uses them.
"""

from __future__ import annotations

import gc
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


PROMPT_SHAPE = (2, 32)  # sequences x tokens: 512 routes over Qwen3's 128 experts, 4 each on average
PROMPT_SEED = 0
# the reference's file name says which prompt it was computed on: another prompt computes it again
REFERENCE_NAME = f"logits-{PROMPT_SHAPE[0]}x{PROMPT_SHAPE[1]}-seed{PROMPT_SEED}.pt"
# room for the tokens whose routes rounding flips to be others than the one-process forward's
BOUND_FACTOR = 2.0
# bf16's own error (root mean square) over that of the logits, above which the bound would admit anything: the
# reference is refused
WELL_CONDITIONED = 0.1


def prompt(vocab_size: int) -> Any:
    """The fixed token ids every forward runs on."""
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(PROMPT_SEED)
    return torch.randint(vocab_size, PROMPT_SHAPE, generator=generator)


def forward_logits(model: Any, ids: Any) -> Any:
    """`model`'s float32 logits on `ids` (a DeepSpeed engine or a model; a DTensor output made whole), on the CPU."""
    import torch  # noqa: PLC0415

    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids.to(next(model.parameters()).device), use_cache=False).logits
    if hasattr(logits, "full_tensor"):
        logits = logits.full_tensor()
    return logits.detach().to("cpu", torch.float32)


@dataclass(frozen=True, slots=True)
class LogitsVerdict:
    error: float  # root mean square of (logits - float32 logits)
    bound: float  # BOUND_FACTOR x that of the one-process bf16 logits
    from_one_process: float  # max |logits - one-process bf16 logits|: 0 where the forward is the stock one exactly
    half_the_experts: float  # the error of a float32 forward missing half of every layer's experts: the judge's reach
    problem: str | None


def _rms(difference: Any) -> float:
    return float(difference.double().square().mean().sqrt())


def judge(logits: Any, reference: dict[str, Any]) -> LogitsVerdict:
    """`logits` against the reference (`reference_logits`); NaN, a missing or a misshapen tensor fails."""
    one_process, exact = reference["one_process"].float(), reference["float32"]
    bound = BOUND_FACTOR * _rms(one_process - exact)
    reach = float(reference.get("half_the_experts", math.nan))
    if tuple(logits.shape) != tuple(exact.shape):
        shapes = f"{tuple(logits.shape)}, expected {tuple(exact.shape)}"
        return LogitsVerdict(math.nan, bound, math.nan, reach, f"logits of shape {shapes}")
    logits = logits.float()
    error, from_one_process = _rms(logits - exact), float((logits - one_process).abs().max())
    if not (error <= bound):
        return LogitsVerdict(
            error,
            bound,
            from_one_process,
            reach,
            f"logits {error:.4g} (root mean square) from the float32 forward's, over {BOUND_FACTOR:g}x the "
            f"one-process bf16 forward's ({bound:.4g})",
        )
    return LogitsVerdict(error, bound, from_one_process, reach, None)


def judge_agreement(logits: Any, first: Any, bound: float) -> tuple[float, str | None]:
    """This rank's logits against the first rank's: every rank ran the same prompt through the same model, so they
    differ by no more than bf16's rounding (a rank left with its own experts' partial sums differs by their share)."""
    difference = _rms(logits - first)
    if not (difference <= bound):
        return difference, f"logits {difference:.4g} (root mean square) from rank 0's, over the bound ({bound:.4g})"
    return difference, None


def reference_logits(checkpoint: Path, model_class: str) -> dict[str, Any]:
    """The one-process forwards of `checkpoint` by the transformers imported, bf16 and float32, and how far a float32
    forward missing half of every layer's experts lands (what a rank's unreduced partial sums look like); refused
    where bf16's own error is not small against the logits, or where that broken forward would pass."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    model_type = getattr(transformers, model_class)
    model = model_type.from_pretrained(checkpoint, dtype=torch.bfloat16)
    ids = prompt(model.config.get_text_config().vocab_size)
    reference: dict[str, Any] = {"one_process": forward_logits(model, ids)}
    del model
    gc.collect()  # the float32 load is twice the bf16 one: the bf16 model's memory goes back first
    model = model_type.from_pretrained(checkpoint, dtype=torch.float32)
    reference["float32"] = forward_logits(model, ids)
    bound = BOUND_FACTOR * _rms(reference["one_process"].float() - reference["float32"])
    if not (bound <= BOUND_FACTOR * WELL_CONDITIONED * _rms(reference["float32"])):
        raise ValueError(
            f"{checkpoint}: bf16 logits are {bound / BOUND_FACTOR:.4g} from float32's (root mean square), over "
            f"{WELL_CONDITIONED:g}x the logits' own: not well conditioned, a bound from them would admit anything"
        )
    _drop_half_of_every_layer_s_experts(model)
    reference["half_the_experts"] = torch.tensor(_rms(forward_logits(model, ids) - reference["float32"]))
    if not (reference["half_the_experts"] > bound):
        raise ValueError(
            f"{checkpoint}: a forward missing half of every layer's experts is "
            f"{float(reference['half_the_experts']):.4g} from the float32 one, within the bound ({bound:.4g}): the "
            "logits cannot judge this model's experts"
        )
    return reference


def _drop_half_of_every_layer_s_experts(model: Any) -> None:
    """Zero the second half (by expert) of every experts module's parameters: the experts a second rank holds."""
    import torch  # noqa: PLC0415

    experts = [module for name, module in model.named_modules() if name.endswith(".experts")]
    if not experts:
        raise ValueError(f"{type(model).__name__} has no `experts` module: nothing to judge the logits' reach with")
    with torch.no_grad():
        for module in experts:
            if isinstance(module, torch.nn.ModuleList):  # one module per expert
                for param in (p for expert in module[len(module) // 2 :] for p in expert.parameters()):
                    param.zero_()
            for param in module.parameters(recurse=False):  # experts stacked along the first dimension
                param[param.shape[0] // 2 :] = 0.0


def main(argv: list[str]) -> None:
    import torch  # noqa: PLC0415

    checkpoint, model_class, out = Path(argv[0]), argv[1], Path(argv[2])
    partial = out.with_name(f".{out.name}.partial")
    torch.save(reference_logits(checkpoint, model_class), partial)
    partial.replace(out)


if __name__ == "__main__":
    main(sys.argv[1:])
