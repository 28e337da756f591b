"""What a parity rank reports: the contract between `worker` (writes) and `run`/`judges` (read and judge).

Results travel as `torch.save` files. `read_result` parses one back: a file that is missing, a rank that failed, or
a result that lacks a field the contract requires becomes a `RankFailure` naming what is missing, so a judge never
reads a field that is not there and a missing figure can never count as a pass.
"""

# No `from __future__ import annotations`: TypedDict reads `NotRequired` off evaluated annotations only, and
# `parse` relies on `__required_keys__`.
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeVar


Tensor = Any  # torch.Tensor: torch is Any to mypy in this project (pyproject.toml)


class SingleRun(TypedDict):
    """The one-process reference: its loss per step and its final weights."""

    losses: list[float]
    weights: dict[str, Tensor]


class Export(TypedDict):
    """Saving a Hub checkpoint on this rank: how far its resident memory rose."""

    save_peak_rise_mib: float


class SavedCheckpoint(TypedDict):
    """`engine.save_checkpoint`, a reload into a freshly loaded engine, and one more step on both."""

    loaded: bool
    frozen: list[str]
    restored_equal: bool
    loss_continued: float
    loss_resumed: float
    weights_continued: dict[str, Tensor]
    weights_resumed: dict[str, Tensor]


class TrainedRank(TypedDict):
    """One rank of a distributed run: what the load handed over, the losses, and the final weights."""

    policy: str
    # the parameters the load handed to DeepSpeed's expert groups, and whether each survived the wrap bit for bit
    experts: list[str]
    unchanged: dict[str, bool]
    losses: list[float]
    # gathered after training; expert tensors are this rank's shard
    weights: dict[str, Tensor]
    export: NotRequired[Export]
    checkpoint: NotRequired[SavedCheckpoint]


class Reloaded(TypedDict):
    """One process reloading a saved Hub checkpoint with plain `from_pretrained`."""

    weights: dict[str, Tensor]
    loading_info: dict[str, list[str]]
    keys_on_disk: list[str]
    keys_in_checkpoint: list[str]


@dataclass(frozen=True, slots=True)
class RankFailure:
    """A rank with no usable result: its error (or the fields its result lacked) and where it was."""

    error: str
    stage: str = ""


Contract = TypeVar("Contract", bound=Mapping[str, object])


def read_raw(path: Path) -> dict[str, Any]:
    """A result file as written, `{"error": ...}` when there is none."""
    import torch  # noqa: PLC0415  # the orchestrator imports torch only when it reads results

    if not path.exists():
        return {"error": f"{path.parent.name}/{path.name}: no result"}
    raw: dict[str, Any] = torch.load(path, weights_only=True)
    return raw


def parse(raw: dict[str, Any], contract: type[Contract]) -> Contract | RankFailure:
    """`raw` as `contract`, or a `RankFailure`: the rank's own error, or the required fields it lacks."""
    if "error" in raw:
        return RankFailure(str(raw["error"]), str(raw.get("stage", "")))
    required: frozenset[str] = vars(contract)["__required_keys__"]
    missing = sorted(required - raw.keys())
    if missing:
        return RankFailure(f"result lacks {missing} (a {contract.__name__})")
    result: Contract = raw  # type: ignore[assignment]  # checked against the contract's required keys just above
    return result


def transformers_file(raw: dict[str, Any]) -> str:
    """Which transformers the rank imported (a fact every result carries, success or failure)."""
    return str(raw.get("transformers_file"))
