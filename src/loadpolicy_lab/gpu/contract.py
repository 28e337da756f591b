"""The GPU check's contract: what `run` hands a rank (GpuSpec) and what a rank reports (TrainResult, ReadResult)."""

from typing import TypedDict


class GpuSpec(TypedDict):
    case: str  # a `cases.Case` name
    mode: str  # "reference" (one process, plain load and training) or "distributed" (the case) or "read"
    checkpoint: str
    reference: str  # the reference's trained checkpoint (written by the reference, compared by the case's rank 0)
    out: str  # where the case saves (loaded/, trained/)
    world: int  # the case's world size: the reference trains on every rank's batches


class TrainResult(TypedDict):
    rank: int
    device: str
    backend: str
    policy: str | None
    transformers_file: str
    load_seconds: float  # from_pretrained, the device synchronised
    device_peak_bytes: int | None  # torch's allocator peak while loading; None on the CPU
    misplaced: list[str]  # partitions, placeholders and buffers not where the case needs them
    placed: int  # parameters and buffers checked
    losses: list[float]
    # rank 0 (None elsewhere): the loaded model saved by partition writes against the checkpoint's tensors, and the
    # trained save against the one-device reference
    saved_unequal: list[str] | None
    compared: int
    trained_max_diff: float | None
    moved: int  # trained tensors that differ from the checkpoint's
    bound: float  # the trained tensors' tolerance on this device


class ReadResult(TypedDict):
    rank: int
    device: str
    transformers_file: str
    bytes: int  # the rank's share read by each way
    seconds: dict[str, float]  # way -> seconds, every way from a cold page cache
    unequal: list[str]  # ranges read by the pipeline that differ from the checkpoint's


class ReferenceResult(TypedDict):
    rank: int
    device: str
    transformers_file: str
    losses: list[float]
