"""The save benchmark's contract: what `run` hands every rank (SaveSpec), what a rank reports (SaveMeasurement)."""

from typing import NotRequired, TypedDict


class SaveSpec(TypedDict):
    way: str  # a `cases.Way`
    model_class: str
    checkpoint: str
    distributed: dict[str, int | bool] | None
    directory: str  # where the save writes (emptied before the launch)


class SaveMeasurement(TypedDict):
    rank: int
    policy: str | None
    transformers_file: str
    seconds: float  # the save alone, every rank starting together; the slowest rank counts
    held_total: int  # resident bytes once loaded, just before saving
    peak_total: int  # the largest resident bytes while saving
    # the most GPU memory torch's allocator held while saving; None on the CPU (absent from older runs' results)
    device_peak_bytes: NotRequired[int | None]
    partition_bytes: int  # the bytes of this rank's partitions
    # rank 0, for ways whose files are checked: names whose saved tensor differs from the checkpoint's, or is missing
    # or extra; None elsewhere
    saved_unequal: list[str] | None
    compared: int  # tensors compared with the checkpoint (0 where nothing is checked)
