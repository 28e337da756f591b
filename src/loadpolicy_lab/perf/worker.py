"""One rank of a benchmark launch: `python -m loadpolicy_lab.perf.worker SPEC OUT` under torchrun.

Measures this rank's `from_pretrained`: wall time, peak RSS (anonymous and file-backed), bytes read from storage, the
bytes it holds afterwards and the baseline RSS just before; then, untimed, checks the loaded values against the
checkpoint's (`perf.fingerprint`) and, where the spec names a reference, the logits of a forward on a fixed prompt
against the stock one-process forwards (`perf.logits`). Writes OUT/rank<R>.json (`contract.LoadMeasurement`). The
figures' definitions: docs/benchmark.md.
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

from loadpolicy_lab.harness.device import (
    DeviceWindow,
    RankDevice,
    rank_device,
    start_deepspeed_distributed,
    start_process_group,
    synchronize,
)
from loadpolicy_lab.harness.procfs import PeakSampler, io_counters, memory_status, reset_resident_peak
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.harness.setup import show_zero3, zero3_config
from loadpolicy_lab.perf.contract import BenchSpec, LoadMeasurement, LogitsFigures
from loadpolicy_lab.perf.fingerprint import check_loaded
from loadpolicy_lab.perf.logits_rank import NO_LOGITS, judge_logits
from loadpolicy_lab.training.autoep import expert_parallel_section


def _local(param: Any) -> Any:
    """The part of `param` this rank holds: ZeRO-3's partition, a DTensor's local shard, or the tensor."""
    if hasattr(param, "ds_tensor"):
        return param.ds_tensor
    return param.to_local() if hasattr(param, "to_local") else param.data


def load(spec: BenchSpec, model_class: Any) -> Any:
    import torch  # noqa: PLC0415
    from transformers import DistributedConfig  # noqa: PLC0415

    kwargs: dict[str, Any] = {"dtype": torch.bfloat16}
    if spec["distributed"] is not None:
        kwargs["distributed_config"] = DistributedConfig(**spec["distributed"])
    if spec["requested"]:
        kwargs["load_policy"] = spec["requested"]
    return model_class.from_pretrained(spec["checkpoint"], **kwargs)


# set (to anything), every rank writes OUT/rank<R>.profile.txt: where its `from_pretrained` spent the time (cProfile,
# which slows the load: read the shares, not the seconds)
PROFILE = "LOADPOLICY_PROFILE_LOAD"


def _profiled(this: Rank, spec: BenchSpec, model_class: Any) -> Any:
    import cProfile  # noqa: PLC0415
    import io  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    profile = cProfile.Profile()
    try:
        return profile.runcall(load, spec, model_class)
    finally:
        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(40)
        this.result_path(".profile.txt").write_text(text.getvalue(), encoding="utf-8")


def _time_partition_reads() -> list[float]:
    """The seconds of each call of the patched tree's partition reads (from opening the files to the last byte in
    place, conversions included), appended once it returns: the part of a load that a reader alone (torch DCP into
    tensors allocated beforehand) does. Stays empty on stock, and for a load that read no partitions."""
    from transformers import modeling_utils  # noqa: PLC0415

    spent: list[float] = []
    reads = getattr(modeling_utils, "load_zero3_partitions", None)
    if reads is None:
        return spent

    @functools.wraps(reads)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return reads(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    modeling_utils.load_zero3_partitions = timed
    return spent


def _touch_every_tensor(model: Any, device: RankDevice) -> tuple[int, float]:
    """Touch every parameter and buffer (memory-mapped pages become resident, no full-size temporary); their bytes and
    the seconds it took: shard-on-read leaves memory-mapped pages unread until first use, and a load is complete only
    once they are in."""
    import torch  # noqa: PLC0415

    start, owned = time.perf_counter(), 0
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            local = _local(tensor)
            owned += local.numel() * local.element_size()
            if local.is_contiguous():  # one element per 4 KiB page faults every page in, with little to add up
                local.view(-1)[:: max(1, 4096 // local.element_size())].sum()
            else:
                local.sum()
    synchronize(device)
    return owned, time.perf_counter() - start


def _initialize(model: Any, config: dict[str, Any], device: RankDevice) -> tuple[float, int, Any]:
    """Seconds and peak RSS of `deepspeed.initialize(model)`, every rank starting together, after the measurements of
    loading: a model loaded whole is partitioned here (its parameters broadcast from rank 0 first), one loaded into
    ZeRO-3 partitions is not, AutoEP regroups the experts here. No optimizer, so that only what loading left undone is
    timed. And the engine."""
    import deepspeed  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if "expert_parallel" in config:  # AutoEP on the stock tree
        from loadpolicy_lab.training.autoep import apply_output_capture_registry_shim  # noqa: PLC0415

        apply_output_capture_registry_shim()
    # transformers' MoE blocks hold their experts as `experts`: AutoEP must replace every one of them
    blocks = sum(isinstance(getattr(m, "experts", None), torch.nn.Module) for m in model.modules())
    torch.distributed.barrier()
    reset_resident_peak()
    start = time.perf_counter()
    with PeakSampler() as sampler:
        engine, *_ = deepspeed.initialize(model=model, config=config)
        synchronize(device)
        torch.distributed.barrier()  # the slowest rank's
    seconds = time.perf_counter() - start
    if "expert_parallel" in config:
        replaced = sum(bool(getattr(m, "_is_autoep_layer", False)) for m in engine.modules())
        if replaced != blocks or not blocks:
            raise RuntimeError(
                f"deepspeed.initialize replaced {replaced} of the model's {blocks} MoE blocks with an AutoEPMoELayer "
                f"(preset_model={config['expert_parallel'].get('preset_model')!r})"
            )
    return seconds, max(sampler.peak["total"], memory_status()["VmHWM"]), engine


def _initialize_and_judge_logits(
    this: Rank, spec: BenchSpec, model: Any, config: dict[str, Any], device: RankDevice
) -> tuple[float | None, int | None, LogitsFigures]:
    """`deepspeed.initialize` (ZeRO-3 launches), then the logits where the spec names a reference for them."""
    if spec["zero3"]:
        this.stage("deepspeed.initialize")
    seconds, peak, engine = _initialize(model, config, device) if spec["zero3"] else (None, None, model)
    if spec["logits"] is None:
        return seconds, peak, NO_LOGITS
    return seconds, peak, judge_logits(this, Path(spec["logits"]), engine, model.config.get_text_config().vocab_size)


def _compare_with_checkpoint(this: Rank, fingerprints: Path, model: Any) -> tuple[int, list[str]]:
    """The values loaded, against the checkpoint's, before `deepspeed.initialize` touches them (collective)."""
    this.stage("fingerprints")
    return check_loaded(model, json.loads(fingerprints.read_text(encoding="utf-8"))["fingerprints"])


def _zero3_config(world: int) -> dict[str, Any]:
    # bf16 as users train: without it zero.Init keeps its partitions in float32, twice the bytes of the checkpoint.
    return zero3_config(world, bf16={"enabled": True})


def _launch_config(spec: BenchSpec, world: int) -> dict[str, Any]:
    """The DeepSpeed config every rank holds: ZeRO-3, with AutoEP's section (experts over every rank) where the case
    asks for it."""
    import transformers  # noqa: PLC0415

    config = _zero3_config(world)
    if spec["autoep"]:
        model_type = transformers.AutoConfig.from_pretrained(spec["checkpoint"]).model_type
        config["expert_parallel"] = expert_parallel_section(model_type, world)
    return config


def _init_distributed(this: Rank, zero3: bool) -> RankDevice:
    """The process group on this rank's device (one GPU per rank, or the CPU); the device."""
    this.stage("init_distributed")
    device = rank_device()
    if zero3:
        return start_deepspeed_distributed(device)
    # a load DeepSpeed will not wrap: set up as its users do, without DeepSpeed (which would refuse EP here)
    return start_process_group(device)


def _measure_load(this: Rank, spec: BenchSpec) -> LoadMeasurement:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    zero3 = _launch_config(spec, this.world_size)
    keep_alive = show_zero3(zero3) if spec["zero3"] else None  # noqa: F841  # held while loading
    device = _init_distributed(this, spec["zero3"])
    # Import the model's module before timing (transformers imports it lazily): loading is what is measured.
    model_class = getattr(transformers, spec["model_class"])
    reading = _time_partition_reads()
    torch.distributed.barrier()  # every rank starts loading together
    reset_resident_peak()
    before, io_before = memory_status(), io_counters()
    start, cpu_start = time.perf_counter(), time.process_time()
    this.stage("from_pretrained")
    with PeakSampler() as sampler, DeviceWindow(device) as on_device:
        model = _profiled(this, spec, model_class) if os.environ.get(PROFILE) else load(spec, model_class)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    io_after, peak_hwm = io_counters(), memory_status()["VmHWM"]
    owned, touch_seconds = _touch_every_tensor(model, device)
    held = memory_status()
    io_touched = io_counters()  # pages of memory-mapped tensors that loading left untouched are read on first use
    # what loading partitioned, before `deepspeed.initialize` partitions the rest
    unpartitioned = sum(not hasattr(p, "ds_id") for p in model.parameters())
    fingerprinted, value_problems = _compare_with_checkpoint(this, Path(spec["fingerprints"]), model)
    initialize_seconds, initialize_peak, logits = _initialize_and_judge_logits(this, spec, model, zero3, device)
    policy = getattr(model, "_load_policy", None)  # stock transformers has none
    result: LoadMeasurement = {
        "rank": this.rank,
        "policy": None if policy is None else type(policy).__name__,
        "loading_branch": None if policy is None else policy.loading_branch.value,
        "transformers_file": transformers.__file__,
        "unpartitioned": unpartitioned,
        "seconds": seconds,
        "touch_seconds": touch_seconds,
        "reading_seconds": sum(reading) if reading else None,
        "cpu_seconds": cpu_seconds,
        "initialize_seconds": initialize_seconds,
        "initialize_peak_total": initialize_peak,
        "rss_before": before["RssAnon"] + before["RssFile"] + before["RssShmem"],
        "anon_before": before["RssAnon"],
        "file_before": before["RssFile"] + before["RssShmem"],
        "peak_anon": sampler.peak["anon"],
        "peak_file": sampler.peak["file"],
        "peak_total": max(sampler.peak["total"], peak_hwm),
        "device_peak_bytes": on_device.peak_bytes,
        "held_anon": held["RssAnon"],
        "held_total": held["RssAnon"] + held["RssFile"] + held["RssShmem"],
        "held_file": held["RssFile"] + held["RssShmem"],
        "read_bytes": io_touched["read_bytes"] - io_before["read_bytes"],
        "read_bytes_loading": io_after["read_bytes"] - io_before["read_bytes"],
        "rchar": io_after["rchar"] - io_before["rchar"],
        "owned_bytes": owned,
        "fingerprinted": fingerprinted,
        "value_problems": value_problems,
        **logits,
    }
    torch.distributed.barrier()
    return result


if __name__ == "__main__":
    run_rank(_measure_load, BenchSpec)
