"""Every relative link and every backticked repository path in README.md and docs/ names something in the tree.

Paths of the transformers tree (`src/transformers/...`, `tests/deepspeed/...`) are checked against the patched tree
itself by `tests/patches/test_readme_commands.py`; DeepSpeed's against the files its series touches; transformers'
`docs/source/` (not in the sdist) is not checked. Text inside fenced
blocks (drafts of upstream pages) is not ours to link.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# Top-level entries a backticked path may start with; `build/` and `dist/` are outputs, not the tree.
TRACKED_TOPS = ("src/", "tests/", "docs/", "patches/", "pins/", "examples/", ".ci/")
TRACKED_FILES = ("README.md", "tox.ini", "pyproject.toml")
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_CODE = re.compile(r"`(?P<text>[^`\n]+)`")
_PATH = re.compile(r"[\w.{},*/-]+")
_FENCE = re.compile(r"^(`{3,}).*?^\1\s*$", re.MULTILINE | re.DOTALL)
# Paths in the upstream trees the series patches, not in this repository.
TRANSFORMERS_TOPS = ("src/transformers", "tests/deepspeed", "tests/utils", "tests/distributed")
# Not checked: transformers' docs/ (the PyPI sdist the series applies to carries none).
UNCHECKED_TOPS = ("docs/source",)
# DeepSpeed's tree: a path counts when a patch of the DeepSpeed series touches it (or a file under it)
DEEPSPEED_TOPS = ("deepspeed/", "tests/unit/runtime", "tests/unit/moe", "tests/unit/checkpoint")
_DIFF_PATH = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)
DEEPSPEED_TOUCHED = {
    match[1]
    for patch in (ROOT / "patches" / "deepspeed").glob("*.patch")
    for match in _DIFF_PATH.finditer(patch.read_text(encoding="utf-8"))
}
# PEFT's tree: a file a patch of the PEFT series touches
PEFT_TOUCHED = {
    match[1]
    for patch in (ROOT / "patches" / "peft").glob("*.patch")
    for match in _DIFF_PATH.finditer(patch.read_text(encoding="utf-8"))
}


def _expand(text: str) -> list[str]:
    """`a/{b,c}.py` -> `a/b.py`, `a/c.py` (the README's shorthand for several modules)."""
    match = re.search(r"\{([^{}]*)\}", text)
    if match is None:
        return [text]
    return list(
        itertools.chain.from_iterable(
            _expand(text[: match.start()] + part + text[match.end() :]) for part in match[1].split(",")
        )
    )


def _exists(page: Path, target: str, base: Path) -> bool:
    path = target.split("#", 1)[0].split(":", 1)[0]  # `file.py:123` cites a line, `file.py::test` a test
    if not path:
        return True
    if base == ROOT and path in PEFT_TOUCHED:
        return True
    if base == ROOT and path.startswith(DEEPSPEED_TOPS):
        return any(
            touched == path.rstrip("/") or touched.startswith(path.rstrip("/") + "/") for touched in DEEPSPEED_TOUCHED
        )
    if "*" in path:
        return any(base.glob(path))
    return (base / path).exists()


def _prose(page: Path) -> str:
    return _FENCE.sub("", page.read_text(encoding="utf-8"))


def _links(page: Path) -> list[str]:
    text = _prose(page)
    return [
        m["target"] for m in _LINK.finditer(text) if not re.match(r"[a-z]+:", m["target"]) and m["target"][0] != "#"
    ]


def _code_paths(page: Path, *, upstream: bool = False) -> list[str]:
    """Backticked paths of this repository (or, with `upstream`, of the transformers tree)."""
    text = _prose(page)
    found = []
    for match in _CODE.finditer(text):
        candidate = match["text"].strip()
        if not _PATH.fullmatch(candidate.split(":", 1)[0]):
            continue
        if candidate.startswith(UNCHECKED_TOPS) or candidate.startswith(TRANSFORMERS_TOPS) != upstream:
            continue
        if candidate.startswith(TRACKED_TOPS) or candidate in TRACKED_FILES:
            found.extend(_expand(candidate))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    missing = [target for target in _links(page) if not _exists(page, target, page.parent)]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_backticked_paths_exist(page: Path) -> None:
    missing = [path for path in _code_paths(page) if not _exists(page, path, ROOT)]
    assert missing == []


def test_the_checks_see_a_broken_path(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("See [x](missing.md) and `src/loadpolicy/nowhere.py` and `src/loadpolicy/{cli,gone}.py`.\n")
    assert [t for t in _links(page) if not _exists(page, t, tmp_path)] == ["missing.md"]
    assert [p for p in _code_paths(page) if not _exists(page, p, ROOT)] == [
        "src/loadpolicy/nowhere.py",
        "src/loadpolicy/gone.py",
    ]


def test_every_result_file_is_listed_in_the_results_index() -> None:
    results = ROOT / "docs" / "results"
    index = (results / "README.md").read_text(encoding="utf-8")
    # A row links its file by its path from the index: `FILE`, or `archive/FILE` for a superseded run.
    listed = set(re.findall(r"^\| \[[^\]]+\]\(([^)\s]+)\)", index, re.MULTILINE))
    present = {p.relative_to(results).as_posix() for p in results.rglob("*") if p.is_file()} - {"README.md"}
    assert listed == present


_TOX_ENV = re.compile(r"tox (?:-p \d+ )?-e ([\w,-]+)")
TOX_ENVS = set(re.findall(r"^\[testenv:([\w-]+)\]", (ROOT / "tox.ini").read_text(encoding="utf-8"), re.MULTILINE))


def test_every_tox_environment_a_page_names_exists() -> None:
    """A page's command must run as written; the results files keep the commands of their day."""
    pages = [page for page in PAGES if "results" not in page.relative_to(ROOT).parts] + [ROOT / ".ci" / "run"]
    unknown = sorted(
        f"{page.relative_to(ROOT)}: {name}"
        for page in pages
        for names in _TOX_ENV.findall(page.read_text(encoding="utf-8"))
        for name in names.split(",")
        if name not in TOX_ENVS
    )
    assert unknown == []
