"""One rank of the training-throughput benchmark: load one way, `deepspeed.initialize`, train, time every step.

`python -m loadpolicy_lab.throughput.worker SPEC OUT` under torchrun. SPEC["way"] is `dispatch`, `tp_ep`, `autoep` or
`zero3` (`cases.Way`). Every way trains the same seeded global batches. Writes OUT/rank<R>.json
(`contract.ThroughputRank`). The ways and the results: docs/training.md.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from typing import Any

import torch
import transformers

from loadpolicy_lab.harness.device import DeviceWindow, RankDevice, start_deepspeed_distributed, synchronize, to_device
from loadpolicy_lab.harness.procfs import memory_status, reset_resident_peak
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.harness.setup import show_zero3, zero3_config
from loadpolicy_lab.throughput.contract import StepTimes, ThroughputRank, ThroughputSpec
from loadpolicy_lab.training import steps as training
from loadpolicy_lab.training.autoep import apply_output_capture_registry_shim, expert_parallel_section


# Profiler event names of the collectives (c10d ops, and the waits of functional collectives, which transformers'
# all-to-all and DTensor redistributions use), first match wins. CPU time: on gloo the op and its wait.
COLLECTIVES = {
    "functional-collective waits": ("wait_tensor",),
    "all-to-all": ("all_to_all", "alltoall"),
    "all-gather": ("all_gather", "allgather"),
    "reduce-scatter": ("reduce_scatter", "reducescatter"),
    "all-reduce": ("all_reduce", "allreduce"),
    "broadcast": ("broadcast",),
}


def ds_config(spec: ThroughputSpec, world: int) -> dict[str, Any]:
    # Buckets of 50M elements instead of DeepSpeed's 500M defaults (2 GB of fp32 per bucket per rank), for every way
    # alike: with the defaults plain ZeRO-3 on moe-300m at 4 ranks needs 6.3 GB per rank, over this machine.
    buckets = {
        "reduce_bucket_size": 50_000_000,
        "allgather_bucket_size": 50_000_000,
        "stage3_prefetch_bucket_size": 50_000_000,
        "stage3_max_live_parameters": 100_000_000,
        "stage3_max_reuse_distance": 100_000_000,
    }
    config = zero3_config(
        world,
        micro_batch=spec["micro_batch"],
        zero=buckets,
        gradient_accumulation_steps=1,
        gradient_clipping=1.0,
        steps_per_print=10_000,
    )
    if spec["way"] == "autoep":
        config["expert_parallel"] = expert_parallel_section(spec["model_type"], spec["ep"])
    return config


def distinct_batches(spec: ThroughputSpec, world: int) -> int:
    """Micro-batches the world trains per step, as the distributed config says (the ranks of a tp = ep group share
    one); one per rank without a distributed config."""
    sizes = spec["distributed"]
    return training.replicas(sizes) if sizes else world


def step_batches(spec: ThroughputSpec, world: int, step: int) -> Any:
    # Seeded per step: every way trains the same global batches, so the judge can compare their losses
    generator = torch.Generator().manual_seed(1000 + step)
    shape = (distinct_batches(spec, world), spec["micro_batch"], spec["sequence"])
    return torch.randint(0, spec["vocab_size"], shape, generator=generator)


def _load(spec: ThroughputSpec, world: int) -> Any:
    from transformers import DistributedConfig  # noqa: PLC0415

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if spec.get("experts_implementation"):  # transformers' own experts (AutoEP replaces them with its layers)
        kwargs["experts_implementation"] = spec["experts_implementation"]
    if spec["distributed"] is not None:
        kwargs["distributed_config"] = DistributedConfig(**spec["distributed"])
    model = getattr(transformers, spec["model_class"]).from_pretrained(spec["checkpoint"], **kwargs)
    model.train()
    return model


def _collective_seconds(profile: Any) -> dict[str, float]:
    """Seconds of one profiled step spent in each kind of collective (the events' own CPU time)."""
    seconds: dict[str, float] = defaultdict(float)
    for event in profile.key_averages():
        name = event.key.lower()
        for kind, needles in COLLECTIVES.items():
            if any(needle in name for needle in needles):
                seconds[kind] += event.self_cpu_time_total / 1e6
                break
    return dict(seconds)


def _events(profile: Any, count: int = 20) -> tuple[dict[str, float], dict[str, int]]:
    """The `count` operators of a profile that took the most CPU time themselves (seconds), and how often each ran."""
    events = sorted(profile.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:count]
    return {e.key: e.self_cpu_time_total / 1e6 for e in events}, {e.key: int(e.count) for e in events}


def _summed(by_phase: list[dict[str, float]], count: int | None = None) -> dict[str, float]:
    """Seconds per key summed over the phases; the `count` largest when given."""
    total: dict[str, float] = defaultdict(float)
    for seconds in by_phase:
        for key, value in seconds.items():
            total[key] += value
    return dict(sorted(total.items(), key=lambda item: item[1], reverse=True)[:count])


def _step(
    engine: Any, device: RankDevice, batch: Any, profiles: dict[str, Any] | None = None
) -> tuple[float, StepTimes]:
    """One training step on `batch` (moved to the engine's device), every rank starting together, each phase's clock
    read once its device work is done; with `profiles`, each phase is profiled on its own into it, so that an
    operator's time is told apart by phase."""

    def phase(name: str) -> Any:
        if profiles is None:
            return contextlib.nullcontext()
        profiles[name] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        return profiles[name]

    ids = to_device(batch, engine.device)
    torch.distributed.barrier()
    start = time.perf_counter()
    with phase("forward"):
        loss = engine(input_ids=ids, labels=ids).loss
        synchronize(device)
    forward = time.perf_counter()
    with phase("backward"):
        engine.backward(loss)
        synchronize(device)
    backward = time.perf_counter()
    with phase("optimizer"):
        engine.step()
        synchronize(device)
    end = time.perf_counter()
    times: StepTimes = {
        "forward": forward - start,
        "backward": backward - forward,
        "optimizer": end - backward,
        "total": end - start,
    }
    return float(loss.item()), times


def _train_steps(
    this: Rank, spec: ThroughputSpec, engine: Any, device: RankDevice, mine: int
) -> tuple[list[float], list[StepTimes], int | None]:
    """The warm-up and measured steps on this rank's micro-batches (`mine`): every step's loss, the measured steps'
    times, and the device's peak memory over them (None on the CPU)."""
    losses, steps = [], []
    with DeviceWindow(device) as on_device:
        for step in range(spec["warmup"] + spec["steps"]):
            this.stage(f"step {step}")
            loss, times = _step(engine, device, step_batches(spec, this.world_size, step)[mine])
            losses.append(loss)
            if step >= spec["warmup"]:
                steps.append(times)
    return losses, steps, on_device.peak_bytes


def _train(this: Rank, spec: ThroughputSpec) -> ThroughputRank:
    import deepspeed  # noqa: PLC0415

    rank, world = this.rank, this.world_size
    this.facts["transformers_file"] = transformers.__file__
    this.stage("init_distributed")
    device = start_deepspeed_distributed()
    config = ds_config(spec, world)
    keep_alive = show_zero3(config)  # noqa: F841  # held while loading
    this.stage("from_pretrained")
    model = _load(spec, world)
    policy = getattr(model, "_load_policy", None)
    # what computes the experts: AutoEP replaces transformers' experts with its own layers
    experts_kernel = (
        "AutoEP per-expert loop"
        if spec["way"] == "autoep"
        else str(getattr(model.config, "_experts_implementation", None) or "default")
    )
    if spec["way"] == "autoep":
        apply_output_capture_registry_shim()
    this.stage("deepspeed.initialize")
    # `fused=True` for every way alike unless asked otherwise: torch's CPU default loops over the tensors and allocates
    # its temporaries at each step, which moved a step by more than the way did (docs/training.md)
    fused = {"fused": True} if spec["adamw"] == "fused" else {}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0, **fused)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    mine = rank // (world // distinct_batches(spec, world))  # consecutive ranks share a tp = ep group's batch
    reset_resident_peak()
    losses, steps, device_peak = _train_steps(this, spec, engine, device, mine)
    peak = memory_status()["VmHWM"]
    this.stage("profiled step")
    phases: dict[str, Any] = {}
    _step(engine, device, step_batches(spec, world, spec["warmup"] + spec["steps"])[mine], phases)
    events = {phase: _events(profile) for phase, profile in phases.items()}
    every_event = [_events(profile, count=10_000)[0] for profile in phases.values()]
    return {
        "rank": rank,
        "way": spec["way"],
        "policy": None if policy is None else type(policy).__name__,
        "tokens_per_step": spec["micro_batch"] * spec["sequence"],
        "distinct_batches": distinct_batches(spec, world),
        "losses": losses,
        "steps": steps,
        "collectives": _summed([_collective_seconds(profile) for profile in phases.values()]),
        "profile_top": _summed(every_event, count=12),
        "profile_top_by_phase": {phase: seconds for phase, (seconds, _) in events.items()},
        "profile_calls_by_phase": {phase: calls for phase, (_, calls) in events.items()},
        "peak_training_bytes": peak,
        "device_peak_training_bytes": device_peak,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")),
        "experts_kernel": experts_kernel,
    }


if __name__ == "__main__":
    run_rank(_train, ThroughputSpec)
