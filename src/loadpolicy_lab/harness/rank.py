"""The one protocol every worker speaks: `python -m <worker> SPEC OUT` on each rank, a stage file, a result file.

A worker reads its JSON spec (a TypedDict of the suite's `contract` module, checked for its keys), says where it is
with `rank.stage(...)` (OUT/rank<R>.stage, read when a launch times out), and writes one result per rank:
OUT/rank<R>.json, or OUT/rank<R>.pt for results that hold tensors. A rank that fails writes its error, the stage it
was in and the traceback's tail before it exits with the error, so the runner can say which rank failed, where, and
why. The reading side parses a result back as its suite's contract with `parse`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar


class Rank:
    """This process's place in the launch, and its stage and result files under `out`."""

    def __init__(self, out: Path) -> None:
        # A one-process reference runs without a launcher: rank 0 of 1.
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.out = out
        self.current = "start"
        # Facts every result carries, success or failure (which transformers the rank imported, ...)
        self.facts: dict[str, Any] = {}

    def stage(self, name: str) -> None:
        self.current = name
        (self.out / f"rank{self.rank}.stage").write_text(name, encoding="utf-8")

    def result_path(self, suffix: str) -> Path:
        return self.out / f"rank{self.rank}{suffix}"

    def write(self, result: Mapping[str, Any], suffix: str = ".json") -> None:
        """The rank's result: JSON, or (suffix ".pt") a `torch.save` file for results holding tensors. Written under
        a temporary name and renamed, so a result that exists is whole: the launcher may kill this rank as soon as
        another exits, and the others wait only until every result exists."""
        result = {**result, **self.facts}
        final = self.result_path(suffix)
        partial = final.with_name(f".{final.name}.partial")
        if suffix == ".json":
            partial.write_text(json.dumps(result), encoding="utf-8")
        else:
            import torch  # noqa: PLC0415  # only workers whose results hold tensors need it

            torch.save(result, partial)
        partial.replace(final)

    def failure(self, exc: BaseException) -> dict[str, Any]:
        return {
            "error": f"{type(exc).__name__}: {exc}",
            "stage": self.current,
            "traceback": traceback.format_exc()[-3000:],
        }


# a spec and a result are TypedDicts (the contract of the suite's `contract` module)
Spec = TypeVar("Spec", bound=Mapping[str, Any])


def run_rank(
    body: Callable[[Rank, Spec], Mapping[str, Any]],
    spec_type: type[Spec],
    suffix: str = ".json",
    *,
    exit_on_error: bool = True,
    argv: list[str] | None = None,
) -> None:
    """Run `body(rank, spec)` as this rank and write its result; on an error, write the failure. A spec lacking a key
    of `spec_type` is such an error, naming the keys.

    With `exit_on_error` the error is re-raised after it is written: the rank exits non-zero and the launcher stops
    the others rather than leaving them waiting in a collective. Without it the rank exits cleanly, for runs whose
    every rank must record the same expected error (a stock tree refusing a load).
    """
    spec_path, out_dir = (sys.argv[1:] if argv is None else argv)[:2]
    rank = Rank(Path(out_dir))
    raw: dict[str, Any] = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    try:
        rank.stage("start")
        missing = sorted(getattr(spec_type, "__required_keys__", frozenset()) - raw.keys())
        if missing:
            raise KeyError(f"{spec_path} lacks {missing} (a {spec_type.__name__})")
        spec: Spec = raw  # type: ignore[assignment]  # checked against the spec's required keys just above
        result = body(rank, spec)
    except Exception as exc:
        rank.write(rank.failure(exc), suffix)
        if exit_on_error:
            raise
        return
    rank.stage("done")
    rank.write(result, suffix)


@dataclass(frozen=True, slots=True)
class RankFailure:
    """A rank with no usable result: its error (or the fields its result lacked) and where it was."""

    error: str
    stage: str = ""  # where the rank was; "" when it wrote nothing (killed, or stopped first)


Contract = TypeVar("Contract", bound=Mapping[str, object])


def read_raw(path: Path) -> dict[str, Any]:
    """A result file as written (JSON, or a `torch.save` file), `{"error": ...}` when there is none."""
    if not path.exists():
        return {"error": f"{path.parent.name}/{path.name}: no result"}
    if path.suffix == ".json":
        loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return loaded
    import torch  # noqa: PLC0415  # only results holding tensors need it

    raw: dict[str, Any] = torch.load(path, weights_only=True)
    return raw


def parse(raw: dict[str, Any], contract: type[Contract]) -> Contract | RankFailure:
    """`raw` as `contract`, or a `RankFailure`: the rank's own error, or the required fields it lacks."""
    if "error" in raw:
        return RankFailure(str(raw["error"]), str(raw.get("stage", "")))
    required: frozenset[str] = vars(contract)["__required_keys__"]
    missing = sorted(required - raw.keys())
    if missing:
        return RankFailure(f"result lacks {missing} (a {contract.__name__})", "its result")
    result: Contract = raw  # type: ignore[assignment]  # checked against the contract's required keys just above
    return result


def transformers_file(raw: dict[str, Any]) -> str:
    """Which transformers the rank imported (a fact every result carries, success or failure)."""
    return str(raw.get("transformers_file"))


def raised_at(traceback: str) -> str:
    """The innermost transformers frame of a rank's traceback, as `path:line` under `transformers/`."""
    frames = re.findall(r'File "[^"]*/src/(transformers/[^"]+)", line (\d+)', traceback)
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else ""
