"""One rank of the training-throughput benchmark: load one way, `deepspeed.initialize`, train, time every step.

`python -m loadpolicy.bench.throughput_worker SPEC OUT` under torchrun. SPEC["way"] is how the MoE model is trained:

- `dispatch`: EPMeta with token dispatch, `DistributedConfig(fsdp_size=W, ep_size=E)` (patched tree): every rank its
  own batch, tokens sent to their experts by all-to-all;
- `tp_ep`: EPMeta as 5.23.0 spells EP, `DistributedConfig(tp_size=E, ep_size=E[, dp_replicate_size=W/E])` (patched
  tree): the E ranks of a group share a batch, experts combined by all-reduce;
- `autoep`: DeepSpeed AutoEP (stock tree, loaded through `zero.Init`, experts swapped in `deepspeed.initialize`);
- `zero3`: plain ZeRO-3 without EP (stock tree): every rank its own batch, every expert gathered where it runs.

Every way trains the same global batches: `batches` distinct micro-batches per step (one per rank, or one per EP group
for `tp_ep`), drawn from one seeded generator. Writes OUT/rank<R>.json (`results.ThroughputRank`).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import transformers

from loadpolicy.bench.autoep_worker import apply_output_capture_registry_shim
from loadpolicy.bench.results import StepTimes, ThroughputRank
from loadpolicy.harness.procfs import memory_status
from loadpolicy.harness.rank import Rank, run_rank
from loadpolicy.parity import worker as parity_worker


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


def ds_config(spec: dict[str, Any], world: int) -> dict[str, Any]:
    config: dict[str, Any] = {
        # Buckets of 50M elements instead of DeepSpeed's 500M defaults (2 GB of fp32 per bucket per rank), for every
        # way alike: with the defaults plain ZeRO-3 on moe-300m at 4 ranks needs 6.3 GB per rank, over this machine.
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 50_000_000,
            "allgather_bucket_size": 50_000_000,
            "stage3_prefetch_bucket_size": 50_000_000,
            "stage3_max_live_parameters": 100_000_000,
            "stage3_max_reuse_distance": 100_000_000,
        },
        "train_micro_batch_size_per_gpu": spec["micro_batch"],
        "train_batch_size": spec["micro_batch"] * world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 10_000,
    }
    if spec["way"] == "autoep":
        config["expert_parallel"] = {
            "enabled": True,
            "autoep_size": spec["ep"],
            "preset_model": spec["model_type"],
            "use_grouped_mm": False,  # CPU: the per-expert loop is the path that runs in plain PyTorch
        }
    return config


def distinct_batches(spec: dict[str, Any], world: int) -> int:
    """Micro-batches the world trains per step, as the distributed config says (the ranks of a tp = ep group share
    one); one per rank without a distributed config."""
    return parity_worker.replicas(spec) if spec["distributed"] else world


def step_batches(spec: dict[str, Any], world: int, step: int) -> Any:
    generator = torch.Generator().manual_seed(1000 + step)
    shape = (distinct_batches(spec, world), spec["micro_batch"], spec["sequence"])
    return torch.randint(0, spec["vocab_size"], shape, generator=generator)


def _load(spec: dict[str, Any], world: int) -> Any:
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


def _all_events(profile: Any) -> dict[str, float]:
    """Every operator of a profile with the CPU time it took itself, in seconds."""
    return {event.key: event.self_cpu_time_total / 1e6 for event in profile.key_averages()}


def _calls(profile: Any, count: int = 20) -> dict[str, int]:
    """How many times each of the operators of `_top(_all_events(profile), count)` ran."""
    calls = {event.key: int(event.count) for event in profile.key_averages()}
    return {key: calls[key] for key in _top(_all_events(profile), count)}


def _top(seconds: dict[str, float], count: int = 12) -> dict[str, float]:
    return dict(sorted(seconds.items(), key=lambda item: item[1], reverse=True)[:count])


def _summed(by_phase: dict[str, dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for seconds in by_phase.values():
        for key, value in seconds.items():
            total[key] += value
    return dict(total)


def _profiled_step(engine: Any, ids: Any) -> dict[str, Any]:
    """One step with each phase profiled on its own, so that an operator's time is told apart by phase."""

    def profiler() -> Any:
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])

    torch.distributed.barrier()
    with profiler() as forward:
        loss = engine(input_ids=ids, labels=ids).loss
    with profiler() as backward:
        engine.backward(loss)
    with profiler() as optimizer:
        engine.step()
    return {"forward": forward, "backward": backward, "optimizer": optimizer}


def _step(engine: Any, ids: Any) -> tuple[float, StepTimes]:
    torch.distributed.barrier()
    start = time.perf_counter()
    loss = engine(input_ids=ids, labels=ids).loss
    forward = time.perf_counter()
    engine.backward(loss)
    backward = time.perf_counter()
    engine.step()
    end = time.perf_counter()
    times: StepTimes = {
        "forward": forward - start,
        "backward": backward - forward,
        "optimizer": end - backward,
        "total": end - start,
    }
    return float(loss.item()), times


def _train(this: Rank, spec: dict[str, Any]) -> ThroughputRank:
    import deepspeed  # noqa: PLC0415
    from transformers.integrations.deepspeed import HfDeepSpeedConfig  # noqa: PLC0415

    rank, world = this.rank, this.world_size
    this.facts["transformers_file"] = transformers.__file__
    this.stage("init_distributed")
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    config = ds_config(spec, world)
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841  # held by a weak reference; before from_pretrained
    this.stage("from_pretrained")
    model = _load(spec, world)
    policy = getattr(model, "_load_policy", None)
    if spec["way"] == "autoep":
        apply_output_capture_registry_shim()
    this.stage("deepspeed.initialize")
    # `fused=True` for every way alike unless asked otherwise: torch's CPU default loops over the tensors and allocates
    # its temporaries at each step, which moved a step by more than the way did (docs/training.md)
    fused = {"fused": True} if spec.get("adamw", "fused") == "fused" else {}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0, **fused)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    mine = rank // (world // distinct_batches(spec, world))  # consecutive ranks share a tp = ep group's batch
    losses, steps = [], []
    Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")  # reset VmHWM: the peak while training
    for step in range(spec["warmup"] + spec["steps"]):
        this.stage(f"step {step}")
        loss, times = _step(engine, step_batches(spec, world, step)[mine])
        losses.append(loss)
        if step >= spec["warmup"]:
            steps.append(times)
    peak = memory_status()["VmHWM"]
    this.stage("profiled step")
    phases = _profiled_step(engine, step_batches(spec, world, spec["warmup"] + spec["steps"])[mine])
    return {
        "rank": rank,
        "way": spec["way"],
        "policy": None if policy is None else type(policy).__name__,
        "tokens_per_step": spec["micro_batch"] * spec["sequence"],
        "distinct_batches": distinct_batches(spec, world),
        "losses": losses,
        "steps": steps,
        "collectives": _summed({phase: _collective_seconds(profile) for phase, profile in phases.items()}),
        "profile_top": _top(_summed({phase: _all_events(profile) for phase, profile in phases.items()})),
        "profile_top_by_phase": {phase: _top(_all_events(profile), 20) for phase, profile in phases.items()},
        "profile_calls_by_phase": {phase: _calls(profile) for phase, profile in phases.items()},
        "peak_training_bytes": peak,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")),
    }


if __name__ == "__main__":
    run_rank(_train)
