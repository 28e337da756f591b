"""docs/upstream/README.md's size and dependency columns, counted from the series (`series sizes --docs`).

A table row names its PR by a stable name (the code text of its link); names.md maps the name to today's position
("transformers PR 6: ...", "DeepSpeed series PR 2: ..."), which names the group of the series whose hunks count.
The transformers table's "needs" says "nothing" exactly where the group applies alone (`Needs: none`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.series import GroupSize, group_sizes, read_series


# the position column's series names, and each series' folder under the transformers series' own
SERIES_FOLDERS = {
    "transformers": ".",
    "DeepSpeed series": "deepspeed",
    "PEFT series": "peft",
    "upstream-ep series": "upstream-ep",
}
_NAME_ROW = re.compile(
    r"^\| `(?P<name>[a-z0-9:-]+)` \|.*\| "
    r"(?P<series>transformers|DeepSpeed series|PEFT series|upstream-ep series) PR (?P<pr>\d+):"
)
_ROW = re.compile(r"^\| \[`(?P<name>[a-z0-9:-]+)`\]\([^)]*\) \|")
SIZES, TESTS, NEEDS = "src +/-", "tests +", "needs"


@dataclass(frozen=True, slots=True)
class Row:
    """A row of a PR table: its line in the page, its stable name, and its cells by the header's names."""

    line: int
    name: str
    cells: dict[str, str]


def read_positions(names_page: Path) -> dict[str, tuple[str, int]]:
    """Each stable name of a series PR: (series, PR number)."""
    found = {}
    for line in names_page.read_text(encoding="utf-8").splitlines():
        if match := _NAME_ROW.match(line):
            found[match["name"]] = (match["series"], int(match["pr"]))
    return found


def sizes_by_pr(patches: Path) -> dict[tuple[str, int], GroupSize]:
    """Every PR of the three series (`patches`: the transformers series' folder) and its counted lines."""
    found = {}
    for series, folder in SERIES_FOLDERS.items():
        for size in group_sizes(read_series(patches / folder)):
            if pr := re.match(r"PR (\d+):", size.label):
                found[(series, int(pr[1]))] = size
    return found


def table_rows(text: str) -> list[Row]:
    """The rows of every PR table of `text` that has a sizes column."""
    rows: list[Row] = []
    header: list[str] = []
    for number, line in enumerate(text.splitlines()):
        if line.startswith("| PR |"):
            header = _cells(line)
        elif not line.startswith("|"):
            header = []
        elif SIZES in header and (match := _ROW.match(line)) and len(cells := _cells(line)) == len(header):
            rows.append(Row(number, match["name"], dict(zip(header, cells, strict=True))))
    return rows


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def counted_cells(size: GroupSize) -> dict[str, str]:
    return {SIZES: f"+{size.source_added} / -{size.source_removed}", TESTS: f"+{size.tests_added}"}


def size_problems(
    rows: list[Row], where: dict[str, tuple[str, int]], sizes: dict[tuple[str, int], GroupSize]
) -> list[str]:
    """Where a row's sizes or dependency are not its patches': every PR of the series must have a row."""
    problems = [f"{name}: no row in the PR tables" for name in sorted(set(where) - {row.name for row in rows})]
    for row in rows:
        size = sizes.get(where[row.name]) if row.name in where else None
        if size is None:
            problems.append(f"{row.name}: not a PR of the series today (names.md: {where.get(row.name)})")
            continue
        for column, counted in counted_cells(size).items():
            if row.cells[column] != counted:
                problems.append(f"{row.name}: {column} {row.cells[column]!r}, the patches' hunks {counted!r}")
        if NEEDS in row.cells and (row.cells[NEEDS] == "nothing") != size.alone:
            problems.append(f"{row.name}: needs {row.cells[NEEDS]!r}, but applies alone: {size.alone}")
    return problems


def with_counted_sizes(text: str, where: dict[str, tuple[str, int]], sizes: dict[tuple[str, int], GroupSize]) -> str:
    """`text` with every row's sizes cells replaced by its patches' (the dependency column is prose: not rewritten)."""
    lines = text.splitlines(keepends=True)
    for row in table_rows(text):
        if (size := sizes.get(where.get(row.name, ("", 0)))) is None:
            continue
        cells = row.cells | counted_cells(size)
        ending = "\n" if lines[row.line].endswith("\n") else ""
        lines[row.line] = "| " + " | ".join(cells.values()) + " |" + ending
    return "".join(lines)
