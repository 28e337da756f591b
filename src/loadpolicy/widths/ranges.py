"""Where each rank's share of a safetensors checkpoint lies: its ZeRO-3 partition of every tensor, as byte ranges of
the files, from the headers alone (pure; no torch)."""

from __future__ import annotations

import json
import math
import struct
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


def partition_range(span: TensorSpan, rank: int, world: int) -> tuple[int, int]:
    """The byte range of `span` that rank `rank` holds as ZeRO-3 partitions it: `ceil(numel / world)` elements per
    rank, the last rank's cut at the end."""
    numel = math.prod(span.shape)
    per = -(-numel // world)
    first, last = min(numel, rank * per), min(numel, (rank + 1) * per)
    size = span.element_size
    return span.start + first * size, span.start + last * size


def share(spans: list[TensorSpan], rank: int, world: int) -> list[tuple[Path, int, int]]:
    """This rank's `(file, start, end)` ranges, adjacent ones merged (the reads a partition reader could issue)."""
    ranges: list[tuple[Path, int, int]] = []
    for span in spans:
        start, end = partition_range(span, rank, world)
        if end <= start:
            continue
        if ranges and ranges[-1][0] == span.file and ranges[-1][2] == start:
            ranges[-1] = (span.file, ranges[-1][1], end)
        else:
            ranges.append((span.file, start, end))
    return ranges
