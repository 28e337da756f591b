"""Pages cite the PRs of the series by stable names; docs/upstream/names.md alone maps them to today's numbers.

A PR's number in the stack and its patch numbers shift whenever a PR is inserted, and "PR 12" reads like an upstream
pull request, so prose names each PR of the three series (transformers, `patches/deepspeed`, `patches/peft`) and each
fork-only patch by the name in the first column of the table in docs/upstream/names.md.

What counts as citing a name (the rule the citation test checks):

- a link whose text is one code span of the names' form (lower-case words joined by `-`, optionally after
  `deepspeed:`, `peft:` or `fork-only:`) and whose target is a page under docs/upstream/
  (`` [`partition-reads`](upstream/partition-reads.md) ``): the name must be in the table, and the link must go to
  one of that name's description files or to names.md itself; an anchor in the link must be a heading of its page;
- any code span of the prefixed form without spaces (`` `deepspeed:...` ``, `` `peft:...` ``, `` `fork-only:...` ``;
  `` `fork-only: reason` ``, the trailer's form, is not one): the name must be in the table.

A bare code span without a prefix (`` `saving` `` beside a link) cannot be told from other code (`tox -e mutants --
partition-reads-one-at-a-time`), so it is not checked: cite a name with a link where no link to it is near.

The other checks: every description file (and anchor) the table names exists; the table's position column agrees
with the three `series` files, row by row (a PR inserted needs its row); and no page says `PR <digit>` or
`patch <digits>` (or a bare `00NN` patch number) in prose. docs/results/ keeps dated records as written, with the
numbers of their day, and is not checked; nor is text inside code spans or fenced blocks (commands, program output).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "docs" / "upstream"
NAMES_PAGE = UPSTREAM / "names.md"
RESULTS = ROOT / "docs" / "results"
PAGES = sorted(
    page
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    if RESULTS not in page.parents and page != NAMES_PAGE
)
# Pages still to convert, edited in changes of their own, as {"README.md": "why"}: the check is a strict xfail for
# them, so a page converted and left here fails too.
PENDING: dict[str, str] = {}
# The series whose PRs the table names, in the table's order, and how its position column spells them.
SERIES = (
    ("transformers", ROOT / "patches" / "series", ""),
    ("DeepSpeed series", ROOT / "patches" / "deepspeed" / "series", "`patches/deepspeed/` "),
    ("PEFT series", ROOT / "patches" / "peft" / "series", "`patches/peft/` "),
    ("upstream-ep series", ROOT / "patches" / "upstream-ep" / "series", "`patches/upstream-ep/` "),
)

NAME = re.compile(r"(?:(?:deepspeed|peft|fork-only|upstream-ep):)?[a-z0-9]+(?:-[a-z0-9]+)*")
_PREFIXED = re.compile(r"`(?P<name>(?:deepspeed|peft|fork-only|upstream-ep):[^`\s]+)`")
_CITED = re.compile(r"\[`(?P<name>[^`\n]+)`\]\((?P<target>[^)\s]+)\)")
_LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \|(?P<rest>.*)\|\s*$", re.MULTILINE)
_FENCE = re.compile(r"^(`{3,}).*?^\1\s*$", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`[^`]*`")
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)
# `PR 15`, `PRs 7-13`, `DeepSpeed series PR 2`, `patch 0030`, `patches 0006-0019`, and a bare patch number (`0034`)
# outside numbers, dates and paths. `PR #45548` (an upstream pull request) has no digit after the space.
_NUMBER = re.compile(r"\bPRs? \d|\b[Pp]atch(?:es)? \d|(?<![\w.:/#-])00\d\d(?![\w.])")


def _blank(match: re.Match[str]) -> str:
    """Keep line numbers: replace a fenced block or code span by its newlines."""
    return "\n" * match[0].count("\n")


def _prose(text: str) -> str:
    return _FENCE.sub(_blank, text)


def _slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m["title"]) for m in _HEADING.finditer(_prose(page.read_text(encoding="utf-8")))}


def _resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page.resolve()), anchor


def read_names(page: Path = NAMES_PAGE) -> dict[str, list[str]]:
    """The names table: each name and the link targets of its description column."""
    names = {}
    for row in _ROW.finditer(page.read_text(encoding="utf-8")):
        description = row["rest"].rsplit("|", 1)[-1]
        names[row["name"]] = [m["target"] for m in _LINK.finditer(description)]
    return names


def read_positions(page: Path = NAMES_PAGE) -> list[str]:
    """The table's position column, row by row."""
    return [row["rest"].rsplit("|", 2)[-2].strip() for row in _ROW.finditer(page.read_text(encoding="utf-8"))]


def series_positions() -> list[str]:
    """Each PR and fork-only patch of the three series as the position column spells it, in the table's order."""
    positions = []
    for label, series, prefix in SERIES:
        groups: list[tuple[str, list[str]]] = []
        for line in series.read_text(encoding="utf-8").splitlines():
            if line.startswith("# "):
                groups.append((line[2:], []))
            elif line.strip():
                groups[-1][1].append(line[:4])
        for header, patches in groups:
            span = patches[0] if len(patches) == 1 else f"{patches[0]}-{patches[-1]}"
            pr = re.match(r"PR (\d+):", header)
            positions.append(f"{label} PR {pr[1]}: {prefix}{span}" if pr else f"fork-only: {span}")
    return positions


def citation_problems(page: Path, names: dict[str, list[str]], names_page: Path = NAMES_PAGE) -> list[str]:
    """Names a page cites that the table lacks, and links to a name that go elsewhere than its description."""
    text = _prose(page.read_text(encoding="utf-8"))
    upstream = names_page.parent.resolve()
    problems = [f"unknown name {m['name']!r}" for m in _PREFIXED.finditer(text) if m["name"] not in names]
    for match in _CITED.finditer(text):
        name, (file, anchor) = match["name"], _resolve(page, match["target"])
        if upstream not in file.parents or not NAME.fullmatch(name):
            continue
        if name not in names:
            problems.append(f"unknown name {name!r} linked to {match['target']}")
            continue
        allowed = {names_page.resolve()} | {_resolve(names_page, t)[0] for t in names[name]}
        if file not in allowed:
            problems.append(f"{name!r} linked to {match['target']}, not to its description")
        elif anchor and (not file.exists() or anchor not in _anchors(file)):
            problems.append(f"{name!r} linked to a missing anchor: {match['target']}")
    return problems


def number_problems(page: Path) -> list[str]:
    """Lines of prose that cite a PR or a patch by its number."""
    text = page.read_text(encoding="utf-8")
    prose = _SPAN.sub(_blank, _prose(text)).splitlines()
    return [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if _NUMBER.search(prose[n - 1])]


def _ids(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_names_table_is_well_formed() -> None:
    names = read_names()
    assert len(names) >= 30, "the table in docs/upstream/names.md was not read"
    assert [n for n in names if not NAME.fullmatch(n)] == []
    assert [n for n, targets in names.items() if not targets] == [], "every name needs a description file"


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_every_name_a_page_cites_is_in_the_table(page: Path) -> None:
    assert citation_problems(page, read_names()) == []


def test_the_table_gives_every_pr_of_the_series_its_position_today() -> None:
    """A PR inserted into a series, or a patch renumbered, needs its row here (`series` is the truth)."""
    table, series = read_positions(), series_positions()
    assert len(table) == len(series)
    assert [(t, s) for t, s in zip(table, series, strict=True) if not t.startswith(s)] == []


def test_every_description_file_of_the_table_exists() -> None:
    missing = []
    for name, targets in read_names().items():
        for target in targets:
            file, anchor = _resolve(NAMES_PAGE, target)
            if not file.exists() or (anchor and anchor not in _anchors(file)):
                missing.append(f"{name}: {target}")
    assert missing == []


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, marks=pytest.mark.xfail(strict=True, reason=PENDING[_ids(page)]))
        if _ids(page) in PENDING
        else page
        for page in PAGES
    ],
    ids=_ids,
)
def test_no_page_cites_a_pr_or_a_patch_by_number(page: Path) -> None:
    assert number_problems(page) == []


def test_the_checks_see_a_number_and_an_unknown_name(tmp_path: Path) -> None:
    upstream = tmp_path / "docs" / "upstream"
    upstream.mkdir(parents=True)
    (upstream / "reads.md").write_text("# Reads\n\n## Evidence\n")
    names_page = upstream / "names.md"
    names_page.write_text(
        "| stable name | what | position | description |\n|---|---|---|---|\n"
        "| `reads` | reads | PR 1: 0001 | [reads.md](reads.md) |\n"
        "| `deepspeed:init` | init | DeepSpeed PR 1 | [reads.md](reads.md#evidence) |\n"
    )
    names = read_names(names_page)
    assert names == {"reads": ["reads.md"], "deepspeed:init": ["reads.md#evidence"]}
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[`reads`](upstream/reads.md), [`reads`](upstream/names.md), [`reads`](upstream/reads.md#evidence),\n"
        "`deepspeed:init`, [`docs/upstream/reads.md`](upstream/reads.md), `tox -e mutants -- reads-off`, PR #45548.\n"
        "[`writes`](upstream/reads.md), `peft:saving`, [`deepspeed:init`](upstream/other.md),\n"
        "[`reads`](upstream/reads.md#nowhere); PR 15 and patch 0030,\n"
        "PRs 7-13, 0034-0038 but not `PR 3`, 2026-11-26 or 1.0030.\n"
        "```\nPR 1: its 3 test(s) pass\n```\n"
    )
    assert citation_problems(page, names, names_page) == [
        "unknown name 'peft:saving'",
        "unknown name 'writes' linked to upstream/reads.md",
        "'deepspeed:init' linked to upstream/other.md, not to its description",
        "'reads' linked to a missing anchor: upstream/reads.md#nowhere",
    ]
    assert number_problems(page) == [
        "4: [`reads`](upstream/reads.md#nowhere); PR 15 and patch 0030,",
        "5: PRs 7-13, 0034-0038 but not `PR 3`, 2026-11-26 or 1.0030.",
    ]
