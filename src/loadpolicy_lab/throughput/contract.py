"""What a throughput rank reports: the contract between `throughput.worker` and `throughput.run`."""

from typing import NotRequired, TypedDict


class StepTimes(TypedDict):
    """Seconds of one training step on one rank (every rank starts it together)."""

    forward: float
    backward: float
    optimizer: float
    total: float


class ThroughputRank(TypedDict):
    """One rank of the training-throughput benchmark (`throughput.worker`)."""

    rank: int
    way: str
    policy: str | None  # stock transformers has no `_load_policy`
    tokens_per_step: int  # tokens of this rank's micro-batch
    distinct_batches: int  # distinct micro-batches the world trains per step (ranks of a tp = ep group share one)
    losses: list[float]  # every step, warm-up included
    steps: list[StepTimes]  # the measured steps (after warm-up)
    collectives: dict[str, float]  # seconds of one profiled step in each kind of collective
    profile_top: dict[str, float]  # the operators of that step that took the most CPU time themselves, seconds
    # the same per phase of that step ("forward", "backward", "optimizer"), each profiled on its own
    profile_top_by_phase: dict[str, dict[str, float]]
    profile_calls_by_phase: dict[str, dict[str, int]]  # how many times each of those operators ran
    peak_training_bytes: int  # VmHWM over the training steps
    # the most GPU memory torch's allocator held over them; None on the CPU (absent from older runs' results)
    device_peak_training_bytes: NotRequired[int | None]
    threads: int
    experts_kernel: str  # transformers' `experts_implementation` the model ran, or AutoEP's own layers


class ThroughputSpec(TypedDict):
    """What `run` hands every rank of a training launch (OUT/spec.json)."""

    way: str  # a `cases.Way`
    ep: int
    distributed: dict[str, int | bool] | None
    checkpoint: str
    model_class: str
    model_type: str
    vocab_size: int
    micro_batch: int
    sequence: int
    warmup: int
    steps: int
    experts_implementation: str | None  # transformers' experts kernel; None for its default
    adamw: str  # torch's AdamW implementation: "fused" or "foreach"
