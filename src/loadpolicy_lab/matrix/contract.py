"""What a matrix rank reports for one architecture: the contract between `worker` (writes) and `runner` (judges).

Every field is optional on the wire: a rank that failed wrote only `error`, `stage` and `traceback`, and the judge
treats a missing figure as a failure (`not (x <= bound)`, "no field"), never as a pass.
"""

from __future__ import annotations

from typing import Any, TypedDict


class ExpertSlice(TypedDict):
    """One expert tensor on one rank: its local and full shapes, and whether it equals its slice of the reference."""

    local: list[int]
    full: list[int]
    equal: bool


class LoadCheck(TypedDict, total=False):
    # the policy `from_pretrained` selected (None on stock, which has no `_load_policy`)
    policy: str | None
    # the policy's loading branch (gate 3) as its value, None on stock
    loading_branch: str | None
    missing_keys: list[str]
    unexpected_keys: list[str]
    mismatched_keys: list[str]
    # parameters and buffers still on meta after loading
    on_meta: list[str]
    # parameters ZeRO-3 partitioned (`ds_id`), of `parameters`
    partitioned: int
    parameters: int
    quantized_8bit: int
    # Zero3Init: names whose gathered value differs from the stock one-process load
    gathered_unequal: list[str]
    # otherwise: names outside the experts that differ, and each expert tensor against its slice
    dense_unequal: list[str]
    experts: dict[str, ExpertSlice]
    # max |logits - stock one-process logits| on the same tokens
    max_abs_diff: float
    # where the policy writes partitions when saving: names whose saved tensor is not the checkpoint's (or is missing
    # or extra), after `save_pretrained` on every rank
    saved_unequal: list[str]
    # a failed load: the exception, where the rank was, and the traceback's tail
    error: str
    stage: str
    traceback: str


class RankReport(TypedDict, total=False):
    """One rank's file: a `LoadCheck` per architecture, which tree it imported, and a fatal error if any."""

    results: dict[str, LoadCheck]
    transformers_file: str
    error: str
    stage: str
    traceback: str


class MatrixCase(TypedDict):
    """One architecture a launch loads: its checkpoint, its model class, and the stock one-process reference."""

    arch: str
    checkpoint: str
    model_class: str
    reference: str


class MatrixSpec(TypedDict):
    """What `run` hands every rank of a launch (OUT/spec.json)."""

    launcher: str  # a `Launcher`: accelerate ranks enable ZeRO-3 through `Accelerator`
    zero3: bool
    zero3_config: dict[str, Any]
    distributed: dict[str, int | bool] | None  # `DistributedConfig(**...)`, or none
    bnb_8bit: bool
    cases: list[MatrixCase]
