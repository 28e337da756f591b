"""Where each rank's share of a safetensors checkpoint lies: the bytes its partitions cover, as byte ranges of the
files, from the headers alone (pure; no torch)."""

from __future__ import annotations

import json
import math
import re
import struct
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TensorSpan:
    """One tensor of a safetensors file: its bytes are `[start, end)` of the file."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def element_size(self) -> int:
        return (self.end - self.start) // max(1, math.prod(self.shape))


def read_spans(checkpoint: Path) -> list[TensorSpan]:
    """Every tensor of every `*.safetensors` file under `checkpoint`, in file order."""
    spans = []
    for file in sorted(checkpoint.glob("*.safetensors")):
        with file.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        base = 8 + size
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            first, last = entry["data_offsets"]
            spans.append(TensorSpan(file, name, entry["dtype"], tuple(entry["shape"]), base + first, base + last))
    return sorted(spans, key=lambda s: (s.file, s.start))


def tensor_bytes(spans: list[TensorSpan]) -> int:
    """The bytes of a checkpoint's tensors: its files without their headers."""
    return sum(span.end - span.start for span in spans)


def partition_range(span: TensorSpan, rank: int, world: int) -> tuple[int, int]:
    """The byte range of `span` that rank `rank` holds as ZeRO-3 partitions it: `ceil(numel / world)` elements per
    rank, the last rank's cut at the end."""
    numel = math.prod(span.shape)
    per = -(-numel // world)
    first, last = min(numel, rank * per), min(numel, (rank + 1) * per)
    size = span.element_size
    return span.start + first * size, span.start + last * size


# a checkpoint key of one expert's weight: `model.layers.0.block_sparse_moe.experts.3.w1.weight`
_ONE_EXPERT = re.compile(r"^(?P<layer>.*\.experts)\.(?P<expert>\d+)\.")


def expert_owners(spans: list[TensorSpan], world: int) -> dict[str, int]:
    """The rank that holds each tensor stored per expert, by name: of E experts in a layer, rank r holds the experts
    `[r E/W, (r+1) E/W)` whole, both as expert parallelism over every rank shards them and as ZeRO-3 partitions the
    stacked `[E, ...]` tensor that transformers merges them into. A layer whose experts are not numbered 0..E-1, or
    whose E does not divide by the world, is left out (its stacked tensor's partitions cut through an expert)."""
    experts: dict[str, set[int]] = defaultdict(set)
    found = {span.name: match for span in spans if (match := _ONE_EXPERT.match(span.name))}
    for match in found.values():
        experts[match["layer"]].add(int(match["expert"]))
    owners = {}
    for name, match in found.items():
        numbers = experts[match["layer"]]
        count = len(numbers)
        if numbers == set(range(count)) and count % world == 0:
            owners[name] = int(match["expert"]) * world // count
    return owners


def whole_owners(spans: list[TensorSpan], world: int) -> dict[str, int]:
    """The rank that reads each tensor whole, for a reader that cannot read part of one: the experts where expert
    parallelism puts them (`expert_owners`), every other tensor to the rank with the fewest bytes so far, largest
    first (ties to the lower rank), so that every rank reads about as many bytes as its share of a partition load."""
    owners = expert_owners(spans, world)
    load = [0] * world
    for span in spans:
        if span.name in owners:
            load[owners[span.name]] += span.end - span.start
    for span in sorted(
        (s for s in spans if s.name not in owners), key=lambda s: (s.start - s.end, str(s.file), s.name)
    ):
        rank = min(range(world), key=lambda r: (load[r], r))
        owners[span.name] = rank
        load[rank] += span.end - span.start
    return owners


def file_owners(spans: list[TensorSpan], world: int) -> dict[Path, int]:
    """The rank that reads each file whole, for a reader whose unit is a file: largest first, each to the rank with
    the fewest bytes so far (ties to the lower rank)."""
    sizes: dict[Path, int] = {}
    for span in spans:
        sizes[span.file] = sizes.get(span.file, 0) + span.end - span.start
    load, owners = [0] * world, {}
    for file in sorted(sizes, key=lambda f: (-sizes[f], str(f))):
        rank = min(range(world), key=lambda r: (load[r], r))
        owners[file] = rank
        load[rank] += sizes[file]
    return owners


def share(spans: list[TensorSpan], rank: int, world: int) -> list[tuple[Path, int, int]]:
    """This rank's `(file, start, end)` ranges, adjacent ones merged (the reads a partition reader could issue): the
    whole tensors of the experts it holds (`expert_owners`), and its ZeRO-3 partition of every other tensor."""
    owners = expert_owners(spans, world)
    ranges: list[tuple[Path, int, int]] = []
    for span in spans:
        owner = owners.get(span.name)
        if owner is None:
            start, end = partition_range(span, rank, world)
        else:
            start, end = (span.start, span.end) if owner == rank else (span.start, span.start)
        if end <= start:
            continue
        if ranges and ranges[-1][0] == span.file and ranges[-1][2] == start:
            ranges[-1] = (span.file, ranges[-1][1], end)
        else:
            ranges.append((span.file, start, end))
    return ranges
