"""One rank of a save: load the checkpoint under ZeRO-3 (partitions read), then save it one way, timed and sampled.

`python -m loadpolicy_lab.perf.save_worker SPEC OUT` under torchrun. Writes OUT/rank<R>.json (a `SaveMeasurement`);
rank 0 of a way that writes a checkpoint compares every saved tensor with the checkpoint's own. docs/benchmark.md.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from loadpolicy_lab.harness.device import DeviceWindow, host, start_deepspeed_distributed
from loadpolicy_lab.harness.procfs import PeakSampler, memory_status, reset_resident_peak
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.harness.setup import show_zero3, zero3_config
from loadpolicy_lab.perf.cases import SaveWay
from loadpolicy_lab.perf.contract import SaveMeasurement, SaveSpec


def _zero3_config(world: int) -> dict[str, Any]:
    return zero3_config(world, zero={"stage3_gather_16bit_weights_on_model_save": True}, bf16={"enabled": True})


def _partitions(model: Any) -> list[Any]:
    """This rank's partition of every parameter, as ZeRO-3 holds it (`ds_tensor`)."""
    return [p.ds_tensor for p in model.parameters() if hasattr(p, "ds_tensor")]


def _write_limit(model: Any, directory: Path, rank: int) -> None:
    """This rank's partition bytes, written with plain `pwrite` into a file of its own, then synced."""
    import torch  # noqa: PLC0415

    descriptor = os.open(directory / f"rank{rank}.bytes", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        for partition in _partitions(model):
            view = memoryview(host(partition).contiguous().view(torch.uint8).numpy())
            done = 0
            while done < len(view):
                done += os.pwrite(descriptor, view[done:], offset + done)
            offset += len(view)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _engine(model: Any, config: dict[str, Any]) -> Any:
    """DeepSpeed's engine around `model` (a no-op optimizer: DeepSpeed sets up its checkpointing with one)."""
    import deepspeed  # noqa: PLC0415
    import torch  # noqa: PLC0415

    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    config = config | {"zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def _save(way: SaveWay, model: Any, engine: Any, directory: Path, rank: int) -> None:
    match way:
        case SaveWay.PARTITIONS:
            model.save_pretrained(directory)
        case SaveWay.GATHERED:
            from transformers.integrations.deepspeed import gather_expert_parallel_state_dict  # noqa: PLC0415

            state_dict = gather_expert_parallel_state_dict(model, model.state_dict(), rank == 0)
            model.save_pretrained(directory, state_dict=state_dict, is_main_process=rank == 0)
        case SaveWay.DEEPSPEED_16BIT:
            engine.save_16bit_model(str(directory))
        case SaveWay.WRITE_LIMIT:
            _write_limit(model, directory, rank)


def _unequal_to_checkpoint(directory: Path, checkpoint: Path) -> tuple[list[str], int]:
    """Names whose saved tensor is not the checkpoint's (nothing was trained), or is missing or extra; tensor by
    tensor, so that the comparison holds one tensor of each side at a time."""
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    def index(where: Path) -> dict[str, Path]:
        names = {}
        for file in sorted(where.glob("*.safetensors")):
            with safe_open(file, "pt") as handle:
                names.update(dict.fromkeys(handle.keys(), file))
        return names

    saved, expected = index(directory), index(checkpoint)
    problems = sorted(set(saved) ^ set(expected))
    for name in sorted(set(saved) & set(expected)):
        with safe_open(saved[name], "pt") as ours, safe_open(expected[name], "pt") as theirs:
            if not torch.equal(ours.get_tensor(name), theirs.get_tensor(name)):
                problems.append(name)
    return problems, len(set(saved) & set(expected))


def _measure_save(this: Rank, spec: SaveSpec) -> SaveMeasurement:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from transformers import DistributedConfig  # noqa: PLC0415

    rank, world, way = this.rank, this.world_size, SaveWay(spec["way"])
    config = _zero3_config(world)
    keep_alive = show_zero3(config)  # noqa: F841  # held while loading
    this.stage("init_distributed")
    device = start_deepspeed_distributed()
    this.stage("from_pretrained")
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16}
    if spec["distributed"] is not None:
        kwargs["distributed_config"] = DistributedConfig(**spec["distributed"])
    model = getattr(transformers, spec["model_class"]).from_pretrained(spec["checkpoint"], **kwargs)
    # DeepSpeed's save needs its engine: built before the save is measured, as a training run has it
    engine = _engine(model, config) if way is SaveWay.DEEPSPEED_16BIT else None
    directory = Path(spec["directory"])
    if rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    torch.distributed.barrier()  # every rank starts saving together, into an empty directory
    this.stage(f"save: {way}")
    reset_resident_peak()
    held = memory_status()
    start = time.perf_counter()
    with PeakSampler() as sampler:
        with DeviceWindow(device) as on_device:
            _save(way, model, engine, directory, rank)
        torch.distributed.barrier()  # the save is done when the slowest rank is
    seconds = time.perf_counter() - start
    peak = max(sampler.peak["total"], memory_status()["VmHWM"])
    unequal, compared = None, 0
    if rank == 0 and way.value_checked:
        this.stage("compare the saved files with the checkpoint")
        unequal, compared = _unequal_to_checkpoint(directory, Path(spec["checkpoint"]))
    policy = getattr(model, "_load_policy", None)
    torch.distributed.barrier()
    return {
        "rank": rank,
        "policy": None if policy is None else type(policy).__name__,
        "transformers_file": transformers.__file__,
        "seconds": seconds,
        "held_total": held["RssAnon"] + held["RssFile"] + held["RssShmem"],
        "peak_total": peak,
        "device_peak_bytes": on_device.peak_bytes,
        "partition_bytes": sum(p.numel() * p.element_size() for p in _partitions(model)),
        "saved_unequal": unequal,
        "compared": compared,
    }


if __name__ == "__main__":
    run_rank(_measure_save, SaveSpec)
