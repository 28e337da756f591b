"""What an AutoEP-comparison rank reports: the contract between `autoep.worker` (writes) and `autoep.run` (judges).

Read back with `harness.rank.parse`: a missing field is a failure naming it, never a pass.
"""

# No `from __future__ import annotations`: TypedDict reads `NotRequired` off evaluated annotations only, and
# `parse` relies on `__required_keys__`.
from typing import Any, NotRequired, TypedDict

from loadpolicy_lab.training.contract import SingleRun, Tensor, TrainingSpec


class StageFigures(TypedDict):
    """One timed stage on one rank (`from_pretrained`, `deepspeed.initialize`): seconds and bytes of RSS."""

    seconds: float
    rss_before: int
    peak_anon: int
    peak_file: int
    peak_total: int
    # the most GPU memory torch's allocator held during the stage; None on the CPU (absent from older runs' results)
    device_peak_bytes: NotRequired[int | None]


class ReferenceRun(SingleRun):
    """The one-process reference, with the checkpoint's weights as loaded (before any step)."""

    initial: dict[str, Tensor]


class WayRank(TypedDict):
    """One rank of either way: figures, weights after `deepspeed.initialize` and after training, in the HF layout."""

    policy: str
    figures: dict[str, StageFigures]
    initial: dict[str, Tensor]
    # expert tensor -> [first, last) rows of the full tensor this rank holds
    expert_rows: dict[str, list[int]]
    losses: list[float]
    weights: dict[str, Tensor]
    # EPMeta: what the load handed to DeepSpeed's expert groups (`training.compare.handover_problems`)
    experts: NotRequired[list[str]]
    unchanged: NotRequired[dict[str, bool]]
    # AutoEP: whether the output-capture registry shim was needed, and where AutoEP put each layer's experts
    shim_applied: NotRequired[bool]
    autoep_layers: NotRequired[dict[str, dict[str, object]]]


class AutoEPSpec(TrainingSpec):
    """The training parity runs (the same reference and steps), the way to run, and AutoEP's config section."""

    mode: str  # single, epmeta or autoep (the worker's docstring)

    expert_parallel: NotRequired[dict[str, Any]]
