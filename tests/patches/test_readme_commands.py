"""The plain-git way to apply the series (docs/maintaining.md), run as written, and the transformers paths docs cite.

The block under "Applying the series without our tooling" is read from docs/maintaining.md, `/path/to/loadpolicy`
replaced by this checkout, and run in a pristine 5.23.0 tree tagged `v5.23.0` as a GitHub clone is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from loadpolicy.upstream.checkout import checkout
from loadpolicy.upstream.series import read_series


ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"
CACHE = ROOT / "build" / "cache"
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from test_doc_paths import PAGES, _code_paths  # noqa: E402


IDENTITY = {
    "GIT_AUTHOR_NAME": "reader",
    "GIT_AUTHOR_EMAIL": "reader@example.invalid",
    "GIT_COMMITTER_NAME": "reader",
    "GIT_COMMITTER_EMAIL": "reader@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def readme_git_lines() -> list[str]:
    """The `git ...` lines of the first sh block after docs/maintaining.md's "without our tooling" heading."""
    readme = (ROOT / "docs" / "maintaining.md").read_text(encoding="utf-8")
    section = readme.split("## Applying the series without our tooling", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None, "no sh block under the heading"
    return [line.strip() for line in block[1].splitlines() if line.startswith("git ")]


@pytest.fixture(scope="module")
def readme_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("readme") / "transformers"
    checkout(tree, PATCHES, CACHE, apply=False)
    for git in (["branch", "-m", "main"], ["tag", "v5.23.0"]):  # as a clone of GitHub's repository has them
        subprocess.run(["git", *git], cwd=tree, check=True, env=os.environ | IDENTITY)
    for line in readme_git_lines():
        command = line.replace("/path/to/loadpolicy", str(ROOT))
        result = subprocess.run(
            ["bash", "-c", command], cwd=tree, capture_output=True, text=True, env=os.environ | IDENTITY, check=False
        )
        assert result.returncode == 0, f"docs/maintaining.md line failed: {line}\n{result.stderr}"
    return tree


def test_readme_git_am_line_applies_every_patch(readme_tree: Path) -> None:
    log = subprocess.run(
        ["git", "log", "--format=%s", "v5.23.0..HEAD"], cwd=readme_tree, capture_output=True, text=True, check=True
    )
    names = read_series(PATCHES).names
    assert len(log.stdout.splitlines()) == len(names)
    last = (PATCHES / names[-1]).read_text(encoding="utf-8")
    subject = re.search(r"^Subject: \[PATCH\] (.+(?:\n .+)*)$", last, re.MULTILINE)
    assert subject is not None
    assert log.stdout.splitlines()[0] == " ".join(subject[1].split())


def test_readme_lines_are_found() -> None:
    lines = readme_git_lines()
    assert any(line.startswith("git am ") for line in lines), lines


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_transformers_paths_in_docs_exist_in_the_patched_tree(page: Path, readme_tree: Path) -> None:
    missing = [path for path in _code_paths(page, upstream=True) if not _upstream_exists(readme_tree, path)]
    assert missing == []


def _upstream_exists(tree: Path, path: str) -> bool:
    return (tree / path.split("::", 1)[0].split(":", 1)[0].split("#", 1)[0]).exists()
