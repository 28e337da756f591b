"""The stack check's style step, as a maintainer's CI runs it first: the tree's own ruff version and configuration
on the files a PR touches (real ruff, on small trees made here)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.prefix_style import ruff_for, style_problems


RUFF = shutil.which("ruff")
pytestmark = pytest.mark.skipif(RUFF is None, reason="ruff is not installed (tox -e py installs the tree's pin)")


def _tree(tmp_path: Path, version: str) -> Path:
    (tmp_path / "setup.py").write_text(f'_deps = ["pytest", "ruff=={version}"]\n', encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(
        '[tool.ruff]\nline-length = 119\n[tool.ruff.lint]\nselect = ["E", "F"]\n', encoding="utf-8"
    )
    (tmp_path / "tests").mkdir()
    return tmp_path


def _installed() -> str:
    import subprocess

    return subprocess.run([str(RUFF), "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]


def test_an_undefined_name_and_an_unformatted_file_are_named_and_a_clean_one_passes(tmp_path: Path) -> None:
    tree = _tree(tmp_path, _installed())
    (tree / "tests" / "test_uses.py").write_text('def test_a():\n    assert load_file("x")\n', encoding="utf-8")
    (tree / "tests" / "test_spacing.py").write_text("x = {  'a':1 }\n", encoding="utf-8")
    (tree / "tests" / "test_clean.py").write_text('x = {"a": 1}\n', encoding="utf-8")
    ruff = ruff_for(tree)
    assert style_problems(tree, ["tests/test_clean.py", "tests/gone.py"], ruff) == []
    (check,) = style_problems(tree, ["tests/test_uses.py"], ruff)
    assert check.startswith("ruff check: ")
    assert "F821" in check
    assert "load_file" in check
    (fmt,) = style_problems(tree, ["tests/test_spacing.py"], ruff)
    assert fmt.startswith("ruff format: ")
    assert "test_spacing.py" in fmt


def test_a_ruff_other_than_the_tree_s_pin_is_refused_naming_both(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "0.0.1")
    with pytest.raises(UpstreamError, match=r"is ruff \S+; accepted: ruff==0\.0\.1 \(the tree's pin\)"):
        ruff_for(tree)
