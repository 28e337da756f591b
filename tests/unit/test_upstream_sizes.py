"""docs/upstream/README.md's size and dependency columns are the series' own: `loadpolicy dev series sizes --docs
docs/upstream` writes the counts from the patches' hunks, and this test holds every row of the three PR tables
(transformers, upstream-ep, DeepSpeed, PEFT) to them, and every PR of the series to having a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadpolicy.upstream.series import GroupSize
from loadpolicy.upstream.size_table import read_positions, size_problems, sizes_by_pr, table_rows, with_counted_sizes


ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "docs" / "upstream"


def test_every_pr_table_row_has_the_sizes_and_dependencies_of_its_patches() -> None:
    rows = table_rows((UPSTREAM / "README.md").read_text(encoding="utf-8"))
    assert len(rows) >= 20  # the transformers, upstream-ep, DeepSpeed and PEFT tables all read
    assert size_problems(rows, read_positions(UPSTREAM / "names.md"), sizes_by_pr(ROOT / "patches")) == []


PAGE = """| PR | what | needs | src +/- | tests + |
|---|---|---|---:|---:|
| [`ep-under-zero3`](ep-under-zero3.md) | EP under ZeRO-3 | {needs} | {sizes} | {tests} |

prose
"""
SIZE = GroupSize("PR 6: EP under ZeRO-3", 14, 289, 17, 552, alone=False)
WHERE = {"ep-under-zero3": ("transformers", 6)}


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        ({"sizes": "+197 / -17", "tests": "+552", "needs": "`saving`"}, "src +/- '+197 / -17'"),
        ({"sizes": "+289 / -17", "tests": "+500", "needs": "`saving`"}, "tests + '+500'"),
        ({"sizes": "+289 / -17", "tests": "+552", "needs": "nothing"}, "needs 'nothing'"),
    ],
)
def test_a_stale_count_or_dependency_is_named(cells: dict[str, str], expected: str) -> None:
    problems = size_problems(table_rows(PAGE.format(**cells)), WHERE, {("transformers", 6): SIZE})
    assert len(problems) == 1
    assert expected in problems[0]


def test_a_pr_without_a_row_is_named_and_counts_are_written_into_the_row() -> None:
    assert size_problems([], WHERE, {("transformers", 6): SIZE}) == ["ep-under-zero3: no row in the PR tables"]
    stale = PAGE.format(sizes="+197 / -17", tests="+1", needs="`saving`")
    written = with_counted_sizes(stale, WHERE, {("transformers", 6): SIZE})
    assert written == PAGE.format(sizes="+289 / -17", tests="+552", needs="`saving`")
