"""Every `dev perf` command writes its rows one way: OUT/NAME.md (the command's report), OUT/NAME.json (the rows
themselves, every figure of every launch) and OUT/NAME.png (each way's seconds and peak, the median over its
rounds). Launches of the same way repeated (bench repeats, interleaved rounds) are summed up here as a median and
its spread, never averaged away in the rows."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from loadpolicy_lab.perf.rows import Row


Key = tuple[str, int, str]  # shape, ranks, way


def key(row: Row) -> Key:
    return row.shape, row.ranks, row.way


def grouped(rows: Iterable[Row]) -> dict[Key, list[Row]]:
    """The launches of each way of each shape at each rank count, in the order first seen."""
    groups: dict[Key, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return groups


def values(rows: Iterable[Row], figure: Callable[[Row], float | None]) -> list[float]:
    """The figure of every launch that passed its judge and has it."""
    return [value for row in rows if not row.error and (value := figure(row)) is not None]


def median(rows: Iterable[Row], figure: Callable[[Row], float | None]) -> float | None:
    found = values(rows, figure)
    return statistics.median(found) if found else None


def figure(value: float | None, digits: int = 2) -> str:
    """A figure for a table: "-" where there is none (or NaN, which meets no goal)."""
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def spread(found: Sequence[float], digits: int = 2) -> str:
    """median (min-max); the median alone for one launch."""
    if not found:
        return "-"
    middle = f"{statistics.median(found):.{digits}f}"
    return middle if len(found) == 1 else f"{middle} ({min(found):.{digits}f}-{max(found):.{digits}f})"


def ratio(top: float | None, bottom: float | None) -> str:
    return "-" if top is None or not bottom else f"{top / bottom:.2f}x"


def table(header: Sequence[str], numeric: Sequence[bool], lines: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table; `numeric` right-aligns a column."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if right else "---" for right in numeric) + "|",
        *("| " + " | ".join(cells) + " |" for cells in lines),
    ]


def write(out: Path, name: str, text: str, rows: Sequence[Row], *, plot: bool = True) -> Path:
    """OUT/NAME.md, OUT/NAME.json and (where `plot` and a row has seconds) OUT/NAME.png; the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"{name}.md"
    report.write_text(text, encoding="utf-8")
    (out / f"{name}.json").write_text(json.dumps([asdict(row) for row in rows], indent=2), encoding="utf-8")
    if plot and any(row.seconds is not None for row in rows):
        plot_rows(rows, out / f"{name}.png")
    return report


def plot_rows(rows: Sequence[Row], path: Path) -> None:
    """Per shape: each way's seconds (slowest rank) and peak GiB (largest rank) at each rank count, the median over
    its rounds."""
    import matplotlib  # noqa: PLC0415  # only the lab's environments install it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = grouped(rows)
    shapes = list(dict.fromkeys(row.shape for row in rows))
    counts = sorted({row.ranks for row in rows})
    ways = list(dict.fromkeys(row.way for row in rows))
    figure_, axes = plt.subplots(2, len(shapes), figsize=(5 * len(shapes), 8), squeeze=False)
    width = 0.8 / max(1, len(ways))
    for column, shape in enumerate(shapes):
        for line, (title, measure) in enumerate(
            (("seconds, slowest rank", lambda r: r.seconds), ("peak GiB, largest rank", lambda r: r.peak_gib))
        ):
            axis = axes[line][column]
            for index, way in enumerate(ways):
                heights = [median(groups.get((shape, n, way), []), measure) or 0.0 for n in counts]
                axis.bar([n + (index - len(ways) / 2) * width for n in range(len(counts))], heights, width, label=way)
            axis.set_xticks(range(len(counts)), [f"{n} ranks" for n in counts])
            axis.set_title(f"{shape}: {title}")
            axis.grid(alpha=0.3, axis="y")
            axis.legend(fontsize=6)
    figure_.tight_layout()
    figure_.savefig(path, dpi=110)
