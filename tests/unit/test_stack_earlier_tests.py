"""`loadpolicy dev series stack --every-earlier-test`: at each PR's place in the series, the tests of the PRs before it
run with its own. Checked for real (git worktrees, ruff, pytest) on a small tree made here, whose package is named
`transformers` as the stack check imports it: PR 1 needs nothing, PR 2 builds on it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import export_series, read_series
from loadpolicy.upstream.stack import check_prefixes


BASE = "upstream/1.0"


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, check=True)


def _commit(tree: Path, files: dict[str, str], subject: str, trailers: str) -> None:
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text, encoding="utf-8")
    _git(tree, "add", "-A")
    message = f"{subject}\n\nWhy.\n\nOrigin: vendor\nForwarded: no\nLast-Update: 2026-12-06\n{trailers}\n"
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


def _stack(tmp_path: Path, second_value: int) -> tuple[Path, Path]:
    """PR 1 makes `f()` 2 and tests that; PR 2 adds `g` with its test and sets `f()` to `second_value`."""
    tree = tmp_path / "tree"
    tree.mkdir()
    _git(tree, "init", "-q", "-b", "loadpolicy")
    pristine = {
        "pyproject.toml": "[tool.ruff]\nline-length = 119\n",
        "src/transformers/__init__.py": "",
        "src/transformers/a.py": "def f():\n    return 1\n",
    }
    _commit(tree, pristine, "pristine", "")
    _git(tree, "tag", BASE)
    test_a = "from transformers.a import f\n\n\ndef test_f():\n    assert f() == 2\n"
    files = {"src/transformers/a.py": "def f():\n    return 2\n", "tests/test_a.py": test_a}
    _commit(tree, files, "Return 2", "Stack: PR 1: f returns 2\nNeeds: none")
    files = {
        "src/transformers/a.py": f"def f():\n    return {second_value}\n\n\ndef g():\n    return 3\n",
        "tests/test_g.py": "from transformers.a import g\n\n\ndef test_g():\n    assert g() == 3\n",
    }
    _commit(tree, files, "Add g", "Stack: PR 2: g added")
    patches = tmp_path / "patches"
    export_series(tree, BASE, patches)
    return tree, patches


def test_a_pr_that_breaks_an_earlier_prs_test_fails_only_with_every_earlier_test(tmp_path: Path) -> None:
    tree, patches = _stack(tmp_path, second_value=1)
    own_tests_only = check_prefixes(tree, read_series(patches), BASE, timeout=120)
    assert [result.earlier_tests for result in own_tests_only] == [0, 0]
    with pytest.raises(UpstreamError, match=r"(?s)PR 2: g added.*FAILED tests/test_a.py::test_f"):
        check_prefixes(tree, read_series(patches), BASE, timeout=120, every_earlier_test=True)


def test_every_earlier_test_runs_and_is_said(tmp_path: Path) -> None:
    tree, patches = _stack(tmp_path, second_value=2)
    results = check_prefixes(tree, read_series(patches), BASE, timeout=120, every_earlier_test=True)
    assert [result.earlier_tests for result in results] == [0, 1]
    assert "and with the 1 of the PRs before it at patches 1-2" in results[1].describe()
