"""Every figure in README's "Results at a glance" is traced to a results file: docs/evidence.md says how it was
recomputed, on a line that links the same file, and the counts are recomputed here from the file itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
FIGURE = re.compile(r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x?")


def glance_rows() -> list[tuple[str, str, str]]:
    """(what, figures, linked file) of each row of the README's results table."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Results at a glance\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("what", "---"):
            continue
        link = re.fullmatch(r"\[[^]]+\]\((docs/results/[^)]+)\)", cells[3])
        assert link is not None, f"the row's file is not a link into docs/results: {line}"
        rows.append((cells[0], cells[1], link[1]))
    return rows


ROWS = glance_rows()


def test_the_readme_has_results_at_a_glance() -> None:
    assert len(ROWS) >= 5, ROWS


@pytest.mark.parametrize(("what", "figures", "path"), ROWS, ids=[what for what, _, _ in ROWS])
def test_each_figure_is_in_the_evidence_beside_its_file(what: str, figures: str, path: str) -> None:
    assert (ROOT / path).is_file(), path
    name = Path(path).name
    evidence = [
        line for line in (ROOT / "docs" / "evidence.md").read_text(encoding="utf-8").splitlines() if name in line
    ]
    assert evidence, f"docs/evidence.md cites {name} nowhere"
    for figure in FIGURE.findall(figures):
        assert any(re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", line) for line in evidence), (what, figure)


def test_the_model_type_counts_are_the_files() -> None:
    """ "72 and 80 of 87": plain EP on stock, EP + ZeRO-3 patched (both spellings, 2 and 4 ranks), of every type."""
    ((figures, path),) = [(figures, path) for what, figures, path in ROWS if "model types" in what]
    types = json.loads((ROOT / path).read_text(encoding="utf-8"))
    counts = (
        sum(t["plain_ep_stock"] is True for t in types),
        sum(t["patched_all"] is True for t in types),
        len(types),
    )
    assert figures == "{} and {} of {}".format(*counts)
