"""Whether a benchmark load holds the checkpoint's values: position-weighted sums per parameter, no gather.

Each rank sums the elements it holds at their places in the whole tensor; the sums add up over any split and tell
misplaced values apart. The reference is the stock tree's one-process load
(`python -m loadpolicy_lab.perf.fingerprint`).
How and why: docs/benchmark.md ("Every load's values are checked").
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from loadpolicy_lab.harness.device import collective_device, host


CHUNK = 1 << 22  # elements summed at a time: the float64 temporaries stay at a few tens of MiB
GOLDEN = 0.6180339887498949
# float64 sums of the same elements in another order differ by a few ulps per addition
RELATIVE_BOUND = 1e-9


def _weighted(values: Any, index: Any) -> tuple[float, float]:
    import torch  # noqa: PLC0415

    values = values.detach().to("cpu", torch.float64)
    weights = torch.frac(index * GOLDEN) + 0.5
    return float((values * weights).sum()), float((values.abs() * weights).sum())


def fingerprint(flat: Any, start: int) -> tuple[float, float]:
    """(signed, absolute) weighted sums of `flat`, whose first element sits at `start` in the whole tensor."""
    import torch  # noqa: PLC0415

    signed = absolute = 0.0
    for offset in range(0, flat.numel(), CHUNK):
        values = flat[offset : offset + CHUNK]
        first = start + offset
        part = _weighted(values, torch.arange(first, first + values.numel(), dtype=torch.float64))
        signed, absolute = signed + part[0], absolute + part[1]
    return signed, absolute


def fingerprint_block(local: Any, offsets: tuple[int, ...], whole: tuple[int, ...]) -> tuple[float, float]:
    """The same sums for a block of the whole tensor: `local` starts at `offsets` in a tensor of shape `whole`."""
    import torch  # noqa: PLC0415

    if local.dim() == 0 or local.numel() == 0:
        return fingerprint(local.reshape(-1), 0)
    strides = [1] * len(whole)
    for dim in range(len(whole) - 2, -1, -1):
        strides[dim] = strides[dim + 1] * whole[dim + 1]
    # the flat index of every element after the first dimension's, one slice of the first dimension at a time
    inner = torch.zeros((), dtype=torch.float64)
    for dim in range(1, local.dim()):
        shape = [1] * (local.dim() - 1)
        shape[dim - 1] = -1
        positions = torch.arange(offsets[dim], offsets[dim] + local.shape[dim], dtype=torch.float64)
        inner = inner + (positions * strides[dim]).reshape(shape)
    signed = absolute = 0.0
    for row in range(local.shape[0]):
        part = _weighted(local[row], inner + (offsets[0] + row) * strides[0])
        signed, absolute = signed + part[0], absolute + part[1]
    return signed, absolute


def partition_place(param: Any) -> tuple[int, int, Any]:
    """Where this rank's ZeRO-3 partition of `param` (`ds_tensor`, or any tensor laid out as it is) starts in the whole
    tensor's flat elements, how many it holds (the padding at the end left out), and the group whose ranks' partitions
    make up the whole tensor ("world" for an expert shard)."""
    import torch  # noqa: PLC0415

    group = param.ds_process_group
    size = param.ds_tensor.numel()
    first = torch.distributed.get_rank(group) * size
    count = max(0, min(size, param.ds_numel - first))
    if getattr(param, "ds_zero_placement_family", None) == "autoep_expert":
        # an expert shard: the partition is of this rank's expert rows, the rows of its place in the EP group; over
        # the world every element is held once (one expert data-parallel group per place)
        from deepspeed.utils import groups  # noqa: PLC0415

        expert_group = groups._get_expert_parallel_group(param.group_name)
        return first + torch.distributed.get_rank(expert_group) * param.ds_numel, count, "world"
    return first, count, group


def _held(param: Any) -> tuple[tuple[float, float], Any]:
    """The sums of the elements this rank holds, at their places in the whole tensor, and the group whose ranks'
    sums add up to the whole tensor's (None: this rank holds all of it)."""

    if hasattr(param, "ds_tensor"):
        first, count, group = partition_place(param)
        return fingerprint(param.ds_tensor.reshape(-1)[:count], first), group
    if hasattr(param, "to_local"):  # a DTensor: this rank's block of the whole tensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

        whole = tuple(param.shape)
        _, offsets = compute_local_shape_and_global_offset(whole, param.device_mesh, param.placements)
        sharded = [dim for dim, placement in enumerate(param.placements) if placement.is_shard()]
        if not sharded:
            return fingerprint(param.to_local().reshape(-1), 0), None
        if len(sharded) > 1:
            raise NotImplementedError(f"a DTensor sharded over {len(sharded)} mesh dimensions")
        return fingerprint_block(param.to_local(), tuple(offsets), whole), param.device_mesh.get_group(sharded[0])
    return fingerprint(param.detach().reshape(-1), 0), None


def _all_reduce(values: list[float], group: Any) -> list[float]:
    import torch  # noqa: PLC0415

    group = None if group == "world" else group
    tensor = torch.tensor(values, dtype=torch.float64, device=collective_device(group))
    torch.distributed.all_reduce(tensor, group=group)
    return [float(value) for value in host(tensor)]


def matches(held: tuple[float, float], whole: tuple[float, float]) -> bool:
    """NaN never matches: the comparison is written so that it fails."""
    return abs(held[0] - whole[0]) <= RELATIVE_BOUND * (1.0 + whole[1]) and math.isfinite(held[0])


def check_loaded(model: Any, reference: dict[str, list[float]]) -> tuple[int, list[str]]:
    """Every parameter of `model` against the reference fingerprints; collective: every rank calls it. Returns how
    many parameters were compared and, on each rank, those whose held values do not add up to the checkpoint's."""
    params = dict(model.named_parameters())
    problems = sorted(f"{name}: not in the model" for name in set(reference) - set(params))
    problems += sorted(f"{name}: not in the reference" for name in set(params) - set(reference))
    compared = 0
    # every rank walks the parameters in the same order, so the all-reduces pair up
    for name in sorted(set(params) & set(reference)):
        held, group = _held(params[name])
        if group is not None:
            held = (_all_reduce([held[0]], group)[0], held[1])
        whole = (reference[name][0], reference[name][1])
        compared += 1
        if not matches(held, whole):
            problems.append(f"{name}: {held[0]!r} != checkpoint's {whole[0]!r}")
    return compared, problems


def reference_fingerprints(checkpoint: Path, model_class: str) -> dict[str, list[float]]:
    """Fingerprints of every parameter of a one-process bf16 load of `checkpoint` by the transformers imported."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    model = getattr(transformers, model_class).from_pretrained(checkpoint, dtype=torch.bfloat16)
    return {name: list(fingerprint(p.reshape(-1), 0)) for name, p in model.named_parameters()}


def main(argv: list[str]) -> None:
    checkpoint, model_class, out = Path(argv[0]), argv[1], Path(argv[2])
    fingerprints = reference_fingerprints(checkpoint, model_class)
    out.write_text(json.dumps({"checkpoint": str(checkpoint), "fingerprints": fingerprints}) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
