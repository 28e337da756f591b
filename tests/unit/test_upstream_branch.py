"""`loadpolicy dev series branch`: a PR of a series as a branch of its own and a description, on a small git tree
made here (two PRs: one that needs nothing, one opened after it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loadpolicy.upstream.branch import added_test_files, find_pull_request, render_description, write_branch
from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import export_series


BASE = "upstream/1.0"
TRAILERS = "Origin: vendor\nForwarded: no\nLast-Update: 2026-12-06\nStack: {stack}\n{needs}"


def _git(tree: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, check=True).stdout


def _commit(tree: Path, files: dict[str, str], subject: str, stack: str, needs: str) -> None:
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text, encoding="utf-8")
    _git(tree, "add", "-A")
    message = f"{subject}\n\nWhy.\n\n" + TRAILERS.format(stack=stack, needs=needs)
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


@pytest.fixture
def stack(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(the tree with the series on branch `loadpolicy`, its exported series, docs with names and a README)."""
    tree = tmp_path / "tree"
    tree.mkdir()
    _git(tree, "init", "-q", "-b", "loadpolicy")
    _commit(tree, {"src/a.py": "A = 1\n", "src/b.py": "B = 1\n"}, "pristine", "none", "")
    _git(tree, "tag", BASE)
    _commit(
        tree,
        {"src/a.py": "A = 2\n", "tests/test_a.py": "def test_a(): ...\n"},
        "Fix a",
        "PR 1: a fixed",
        "Needs: none\n",
    )
    _commit(
        tree, {"src/b.py": "B = 2\nC = 3\n", "tests/test_b.py": "def test_b(): ...\n"}, "Grow b", "PR 2: b grown", ""
    )
    patches = tmp_path / "patches"
    export_series(tree, BASE, patches)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "names.md").write_text(
        "| stable name | what | today's position | description file |\n|---|---|---|---|\n"
        "| `a-fixed` | a fixed | transformers PR 1: 0001 | [a-fixed.md](a-fixed.md) |\n"
        "| `b-grown` | b grown | transformers PR 2: 0002 | [README.md](README.md#the-later-prs) |\n",
        encoding="utf-8",
    )
    (docs / "a-fixed.md").write_text("# `a-fixed`\n\nWhy a was wrong, and how it was measured.\n", encoding="utf-8")
    (docs / "README.md").write_text(
        "# Stack\n\n| PR | what | needs | src +/- | tests + |\n|---|---|---|---:|---:|\n"
        "| [`a-fixed`](a-fixed.md) | a | nothing | +1 / -1 | +1 |\n"
        "| [`b-grown`](README.md#the-later-prs) | b | `a-fixed` | +2 / -1 | +1 |\n\n"
        "## The later PRs\n\nSeveral PRs.\n\n**[`b-grown`](names.md)**: b grows.\n\n**[`c`](names.md)**: not b.\n\n"
        "## Elsewhere\n\nnot b either\n",
        encoding="utf-8",
    )
    return tree, patches, docs


def test_a_pr_that_needs_nothing_is_its_own_commits_on_the_pristine_sources(stack: tuple[Path, Path, Path]) -> None:
    tree, patches, docs = stack
    pr = find_pull_request("a-fixed", docs, patches)
    branch, subjects = write_branch(pr, tree, BASE)
    assert (branch, subjects) == ("upstream/a-fixed", ["Fix a"])
    assert _git(tree, "show", f"{branch}:src/b.py") == "B = 1\n"  # not the later PR's
    text = render_description(pr, branch, subjects, added_test_files(tree, branch, pr), BASE)
    assert "1 commit(s) of its own on the pristine sources (upstream/1.0); a fixed." in text
    assert "- Size: src +1 / -1, tests +1." in text
    assert "- Tests it adds: `tests/test_a.py`." in text
    assert text.endswith("Why a was wrong, and how it was measured.\n")


def test_a_pr_that_needs_another_is_the_series_up_to_it_and_its_part_of_a_shared_section(
    stack: tuple[Path, Path, Path],
) -> None:
    tree, patches, docs = stack
    pr = find_pull_request("b-grown", docs, patches)
    branch, subjects = write_branch(pr, tree, BASE)
    assert subjects == ["Fix a", "Grow b"]
    text = render_description(pr, branch, subjects, added_test_files(tree, branch, pr), BASE)
    assert "1 commit(s) of its own on the series up to it (it needs `a-fixed`)" in text
    assert "- Tests it adds: `tests/test_b.py`." in text
    assert "**[`b-grown`](names.md)**: b grows." in text
    assert "not b" not in text  # the next PR's paragraph and the next section stay out


def test_an_unknown_name_is_refused_naming_the_accepted_ones(stack: tuple[Path, Path, Path]) -> None:
    _, patches, docs = stack
    with pytest.raises(UpstreamError, match=r"no PR is named 'b'.*accepted: a-fixed, b-grown"):
        find_pull_request("b", docs, patches)
