"""Whether one training step of a sharded load is the step one process takes: its gradients and updated weights
against the stock tree's one-process step, at real widths, without gathering a parameter.

The reference comes from one process on the stock tree (`python -m loadpolicy_lab.perf.step CKPT CLASS OUT`): the
checkpoint loaded in float32 (its bf16 weights widened exactly) takes one SGD step on a fixed batch, and so does a
bf16 load, as users run it. Every parameter is judged at SAMPLES positions drawn once: the ranks report the positions
their partitions hold (`step_worker`), each must be held by exactly one rank. A sharded bf16 step rounds as often as
the one-process bf16 step, in another order, so its gradient's root mean square distance from the float32 one must
stay within BOUND_FACTOR times the one-process bf16 step's, per parameter; the weights after the step likewise, plus
float32's rounding of the update. What the bound can see is recorded beside it: an expert gradient scaled by half
(what a gradient averaged over one rank too many gives) must fail it, or the reference is refused.
"""

from __future__ import annotations

import gc
import math
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


# sequences x tokens: one sequence per rank at 4 data-parallel ranks, all on each rank at tp = ep. Short: bf16 matrix
# products run a hundred times slower than float32 on a CPU without bf16 instructions (this one: 0.14 GFLOP/s), and
# the vocabulary's projection alone is 2 x tokens x hidden x vocabulary per pass
BATCH_SHAPE = (4, 8)
BATCH_SEED = 1
LEARNING_RATE = 1.0  # plain SGD: the update is the gradient, far above float32's rounding of the weights
SAMPLES = 2048  # positions judged per parameter (at most: half drawn over the tensor, half where it has a gradient)
REFERENCE_NAME = f"step-{BATCH_SHAPE[0]}x{BATCH_SHAPE[1]}-seed{BATCH_SEED}-sgd{LEARNING_RATE:g}-{SAMPLES}.pt"
BOUND_FACTOR = 2.0
# where the one-process bf16 step happens to match float32 closely (few nonzero gradients), the sharded one may still
# round: a floor of float32's own relative precision times the gradient's size, far below any lost factor
FLOAT32_FLOOR = 2.0**-20
EXPERT_SCALE_BROKEN = 0.5


def batch(vocab_size: int) -> Any:
    """The fixed token ids of the step (inputs and labels)."""
    import torch  # noqa: PLC0415

    return torch.randint(vocab_size, BATCH_SHAPE, generator=torch.Generator().manual_seed(BATCH_SEED))


def rows_of(ids: Any, rank: int, world: int, replicas: int) -> Any:
    """This rank's micro-batch: the global batch split over the data-parallel replicas; the ranks of one replica (a
    tp = ep group) share theirs. Equal rows, equal tokens: the mean of the replicas' losses is the batch's."""
    if ids.shape[0] % replicas or world % replicas:
        raise ValueError(f"{ids.shape[0]} sequences over {replicas} replicas of {world} ranks: not an equal split")
    rows = ids.shape[0] // replicas
    replica = rank // (world // replicas)
    return ids[replica * rows : (replica + 1) * rows]


def positions(name: str, grad: Any) -> Any:
    """The flat positions of parameter `name` that are judged: all of a small one; else half drawn over the whole
    tensor and half within its rows (first dimension) that have a gradient, so that an embedding whose batch touches
    a few rows, or experts that few tokens reach, are judged where the step moves them. Drawn by the name."""
    import torch  # noqa: PLC0415

    if grad.numel() <= SAMPLES:
        return torch.arange(grad.numel())
    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    draws = [torch.randint(grad.numel(), (SAMPLES // 2,), generator=generator)]
    rows = grad.reshape(grad.shape[0], -1) if grad.dim() > 1 else grad.reshape(1, -1)
    live = torch.nonzero(rows.abs().amax(dim=1) > 0).reshape(-1)
    if len(live):
        row = live[torch.randint(len(live), (SAMPLES // 2,), generator=generator)]
        draws.append(row * rows.shape[1] + torch.randint(rows.shape[1], (SAMPLES // 2,), generator=generator))
    return torch.cat(draws).unique()


def _one_step(checkpoint: Path, model_class: str, dtype: Any, ids: Any, chosen: dict[str, Any]) -> dict[str, Any]:
    """One SGD step of a one-process load in `dtype`: loss, and the gradient and updated weight at the positions."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    # loaded in bf16 as the ranks load it, then widened: a float32 checkpoint's values are rounded alike
    model = getattr(transformers, model_class).from_pretrained(checkpoint, dtype=torch.bfloat16).to(dtype)
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    params = dict(model.named_parameters())
    if not chosen:
        chosen.update({name: positions(name, p.grad) for name, p in params.items()})
    grads = {n: p.grad.reshape(-1)[chosen[n]].float() for n, p in params.items()}
    before = {n: p.detach().reshape(-1)[chosen[n]].float() for n, p in params.items()}
    experts = sorted(n for n in params if ".experts." in n)
    del model, params
    gc.collect()
    return {"loss": loss.item(), "grads": grads, "weights": before, "experts": experts}


def reference_step(checkpoint: Path, model_class: str) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    config = transformers.AutoConfig.from_pretrained(checkpoint)
    ids = batch(config.get_text_config().vocab_size)
    chosen: dict[str, Any] = {}
    full = _one_step(checkpoint, model_class, torch.float32, ids, chosen)
    half = _one_step(checkpoint, model_class, torch.bfloat16, ids, chosen)
    reference = {
        "positions": chosen,
        "weights": full["weights"],  # bf16 values widened: the same in both loads
        "grads": full["grads"],
        "bf16_grads": half["grads"],
        "loss": full["loss"],
        "bf16_loss": half["loss"],
        "experts": full["experts"],
        "learning_rate": LEARNING_RATE,
    }
    if not reference["experts"]:
        raise ValueError(f"{model_class} has no `.experts.` parameters: the step's judge is for MoE models")
    if problems := reach_problems(reference):
        raise ValueError(f"the step's bound cannot tell a lost factor of 2 in these expert gradients: {problems}")
    return reference


def _rms(values: Any) -> float:
    return float(values.double().pow(2).mean().sqrt()) if values.numel() else 0.0


def grad_bound(reference: dict[str, Any], name: str) -> float:
    grads = reference["grads"][name]
    one_process = _rms(reference["bf16_grads"][name] - grads)
    return BOUND_FACTOR * max(one_process, FLOAT32_FLOOR * _rms(grads))


def weight_bound(reference: dict[str, Any], name: str) -> float:
    """The gradient's bound times the learning rate, plus float32's rounding of the weights it updates."""
    rate = float(reference["learning_rate"])
    rounding = 2.0**-23 * (_rms(reference["weights"][name]) + rate * _rms(reference["grads"][name]))
    return rate * grad_bound(reference, name) + rounding


def reach_problems(reference: dict[str, Any]) -> list[str]:
    """The expert parameters whose gradient, scaled by EXPERT_SCALE_BROKEN, the bound would pass."""
    return [
        name
        for name in reference["experts"]
        if not ((1.0 - EXPERT_SCALE_BROKEN) * _rms(reference["grads"][name]) > grad_bound(reference, name))
    ]


def reach(reference: dict[str, Any]) -> float:
    """How far beyond the bound the least visible expert gradient scaled by half lands (> 1: it fails)."""
    ratios = [
        (1.0 - EXPERT_SCALE_BROKEN) * _rms(reference["grads"][name]) / grad_bound(reference, name)
        for name in reference["experts"]
    ]
    return float(min(ratios, default=math.nan))


@dataclass(frozen=True, slots=True)
class StepVerdict:
    judged: int  # parameters
    grad_ratio: float  # the largest per-parameter (error / bound) of the gradients: <= 1 passes
    grad_worst: str
    weight_ratio: float  # the same for the weights after the step
    weight_worst: str
    loss: float  # the mean of the replicas' losses
    loss_float32: float  # the one-process float32 step's
    loss_bf16: float  # the one-process bf16 step's
    reach: float  # the least visible halved expert gradient over its bound (the reference's)
    problems: tuple[str, ...]


def assemble(count: int, held: list[dict[str, list[Any]]]) -> tuple[Any, Any, Any]:
    """One parameter's gradient and updated weight at its `count` positions from every rank's share (NaN where no
    rank holds one), and how many ranks hold each."""
    import torch  # noqa: PLC0415

    grad = torch.full((count,), math.nan, dtype=torch.float64)
    weight = torch.full((count,), math.nan, dtype=torch.float64)
    holders = torch.zeros(count, dtype=torch.int64)
    for share in held:
        index = torch.tensor(share["index"], dtype=torch.int64)
        grad[index] = torch.tensor(share["grad"], dtype=torch.float64)
        weight[index] = torch.tensor(share["weight"], dtype=torch.float64)
        holders.index_add_(0, index, torch.ones_like(index))  # a position listed twice counts twice
    return grad, weight, holders


def judge_step(reference: dict[str, Any], losses: list[float], samples: list[dict[str, Any]]) -> StepVerdict:
    """Every parameter's gradient and updated weight, assembled from every rank's `samples`, against the reference;
    NaN, a position no rank or several ranks hold, or a parameter missing on either side fails."""
    problems = [f"{n}: no rank reports it" for n in sorted(set(reference["positions"]) - set().union(*samples))]
    problems += [f"{n}: not in the reference" for n in sorted(set().union(*samples) - set(reference["positions"]))]
    worst = {"grad": (-math.inf, ""), "weight": (-math.inf, "")}
    for name, chosen in sorted(reference["positions"].items()):
        grad, weight, holders = assemble(len(chosen), [rank[name] for rank in samples if name in rank])
        if not bool((holders == 1).all()):
            problems.append(f"{name}: {int((holders != 1).sum())} of {len(chosen)} positions not held by one rank")
        expected_weight = reference["weights"][name].double() - reference["learning_rate"] * reference["grads"][name]
        for kind, error, bound in (
            ("grad", _rms(grad - reference["grads"][name].double()), grad_bound(reference, name)),
            ("weight", _rms(weight - expected_weight), weight_bound(reference, name)),
        ):
            if not (error <= bound):
                problems.append(f"{name}: {kind} root mean square error {error:.3g} > bound {bound:.3g}")
            ratio = error / bound if bound > 0 else (0.0 if error == 0 else math.inf)
            ratio = math.inf if math.isnan(ratio) else ratio
            if ratio > worst[kind][0]:
                worst[kind] = (ratio, name)
    loss = sum(losses) / len(losses) if losses else math.nan
    if not math.isfinite(loss):
        problems.append(f"the ranks' loss is {loss} ({len(losses)} reported)")
    if not (reach(reference) > 1.0):  # a reference computed before its own check, or without experts
        problems.append(f"the reference cannot tell a halved expert gradient: {reach_problems(reference) or 'none'}")
    return StepVerdict(
        judged=len(reference["positions"]),
        grad_ratio=worst["grad"][0],
        grad_worst=worst["grad"][1],
        weight_ratio=worst["weight"][0],
        weight_worst=worst["weight"][1],
        loss=loss,
        loss_float32=reference["loss"],
        loss_bf16=reference["bf16_loss"],
        reach=reach(reference),
        problems=tuple(problems),
    )


def main(argv: list[str]) -> None:
    import torch  # noqa: PLC0415

    checkpoint, model_class, out = argv
    torch.save(reference_step(Path(checkpoint), model_class), out)


if __name__ == "__main__":
    main(sys.argv[1:])
