"""The read benchmark of one rank: its share (rank 0 of `world`) of every tensor of a checkpoint, read onto its
device three ways, each from a cold page cache: the partition reads' pipeline (reads in flight through pinned staging
buffers, copies on a side stream), `preadv` of the same ranges into one pinned buffer then a synchronous copy, and
the copy alone (pinned host memory to the device, the bytes already in memory). The pipeline's ranges are compared
with the checkpoint's tensors."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from loadpolicy_lab.gpu.contract import GpuSpec
from loadpolicy_lab.harness.device import RankDevice, host, rank_device, synchronize
from loadpolicy_lab.harness.procfs import evict_from_page_cache
from loadpolicy_lab.harness.rank import Rank


def _ranges(files: list[Any], world: int) -> list[tuple[Any, int, Any, int]]:
    """(file, byte offset, dtype, elements) of rank 0's share of every tensor: ZeRO-3's first partition."""
    from transformers.integrations.deepspeed_partition_reads import _stored_tensors  # noqa: PLC0415

    ranges = []
    for file in files:
        for stored in _stored_tensors(file).values():
            if stored.stored_dtype in ("F32", "BF16", "F16"):
                count = -(-math.prod(stored.shape) // world)
                ranges.append((stored, stored.offset, stored.dtype, count))
    return ranges


def _time_pipeline(files: list[Any], ranges: list[Any], outs: list[Any], device: RankDevice) -> float:
    from transformers.integrations.deepspeed_partition_reads import _ReadsInFlight, _stored_tensors  # noqa: PLC0415

    reads = _ReadsInFlight()
    stored = {file.name: _stored_tensors(file, reads) for file in files}
    start = time.perf_counter()
    for (tensor, _, _, count), out in zip(ranges, outs, strict=True):
        stored[tensor.file.name][tensor.name].read_into(0, count, out)
    reads.wait()
    synchronize(device)
    seconds = time.perf_counter() - start
    reads.close()
    return seconds


def _time_preadv_and_copy(ranges: list[Any], outs: list[Any], device: RankDevice) -> float:
    """`preadv` of each range into one pinned buffer, then a synchronous copy onto the device."""
    import torch  # noqa: PLC0415

    largest = max(count * dtype.itemsize for _, _, dtype, count in ranges)
    pinned = torch.empty(largest, dtype=torch.uint8, pin_memory=not device.on_cpu)
    start = time.perf_counter()
    for (tensor, offset, dtype, count), out in zip(ranges, outs, strict=True):
        size = count * dtype.itemsize
        view, done = memoryview(pinned[:size].numpy()), 0
        while done < size:
            done += os.preadv(tensor.file.fileno(), [view[done:]], offset + done)
        out.copy_(pinned[:size].view(dtype))
    synchronize(device)
    return time.perf_counter() - start


def _time_copy_alone(total: int, device: RankDevice) -> float:
    """The copy of `total` bytes from pinned host memory onto the device, timed on at most 1 GiB and scaled."""
    import torch  # noqa: PLC0415

    whole = torch.empty(min(total, 1 << 30), dtype=torch.uint8, pin_memory=not device.on_cpu)
    target = torch.empty_like(whole, device=device.device)
    start = time.perf_counter()
    target.copy_(whole, non_blocking=True)
    synchronize(device)
    seconds: float = (time.perf_counter() - start) * total / whole.numel()
    return seconds


def _unequal_ranges(ranges: list[Any], outs: list[Any]) -> list[str]:
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    unequal = []
    for (tensor, _, _, count), out in zip(ranges, outs, strict=True):
        with safe_open(tensor.file.name, "pt") as checkpoint_file:
            expected = checkpoint_file.get_tensor(tensor.name).reshape(-1)[:count]
        if not torch.equal(host(out), expected):
            unequal.append(tensor.name)
    return unequal


def measure_reads(this: Rank, spec: GpuSpec) -> dict[str, Any]:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    device = rank_device()
    checkpoint = Path(spec["checkpoint"])
    files = [open(path, "rb", buffering=0) for path in sorted(checkpoint.glob("*.safetensors"))]  # noqa: SIM115
    seconds: dict[str, float] = {}
    try:
        ranges = _ranges(files, spec["world"])
        total = sum(count * dtype.itemsize for _, _, dtype, count in ranges)
        # filled first, so that a range the pipeline leaves unread differs from the checkpoint
        outs = [torch.full((count,), -7.0, dtype=dtype, device=device.device) for _, _, dtype, count in ranges]
        this.stage("read: pipeline")
        evict_from_page_cache(checkpoint)
        seconds["pipeline"] = _time_pipeline(files, ranges, outs, device)
        this.stage("compare the pipeline's ranges with the checkpoint")
        unequal = _unequal_ranges(ranges, outs)
        this.stage("read: preadv + copy")
        evict_from_page_cache(checkpoint)
        seconds["preadv + copy"] = _time_preadv_and_copy(ranges, outs, device)
        this.stage("copy alone")
        seconds["copy alone"] = _time_copy_alone(total, device)
    finally:
        for file in files:
            file.close()
    return {
        "rank": this.rank,
        "device": str(device.device),
        "transformers_file": transformers.__file__,
        "bytes": total,
        "seconds": seconds,
        "unequal": unequal,
    }
