"""`series stack` on a tiny repository: each PR's tests on its prefix, then the fork-only patches' test files on the
whole series (real git, real pytest; `import transformers` is the installed one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import Series
from loadpolicy.upstream.stack import FORK, check_prefixes


pytest.importorskip("transformers")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "PATH": "/usr/bin:/bin",
}


def _commit(repo: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    subprocess.run(["git", "add", "--all"], cwd=repo, check=True, env=GIT_ENV)
    subprocess.run(["git", "commit", "-qm", message], cwd=repo, check=True, env=GIT_ENV)


def _repo(tmp_path: Path, fork_test: str) -> tuple[Path, Series]:
    """base (tagged) -> PR 1 adds tests/test_one.py -> a fork-only patch changes tests/test_one.py's neighbour."""
    repo = tmp_path / "tree"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True, env=GIT_ENV)
    _commit(repo, {"pyproject.toml": "[tool.pytest.ini_options]\n"}, "base")
    subprocess.run(["git", "tag", "base"], cwd=repo, check=True, env=GIT_ENV)
    _commit(repo, {"tests/test_one.py": "def test_one():\n    pass\n"}, "PR 1")
    _commit(repo, {"tests/test_fork.py": fork_test}, "fork")
    patches = tmp_path / "patches"
    patches.mkdir()
    for name in ("0001-one.patch", "0002-fork.patch"):
        (patches / name).write_text("Subject: x\n\n---\n", encoding="utf-8")
    groups = (("PR 1: one", ("0001-one.patch",)), ("fork-only: the fork", ("0002-fork.patch",)))
    return repo, Series(patches, ("0001-one.patch", "0002-fork.patch"), groups)


def test_the_fork_only_patches_test_files_run_on_the_whole_series(tmp_path: Path) -> None:
    repo, series = _repo(tmp_path, "def test_fork():\n    pass\n\ndef test_other():\n    pass\n")
    pr, fork = check_prefixes(repo, series, "base", timeout=300)
    assert (pr.label, pr.patches, pr.tests) == ("PR 1: one", 1, ("tests/test_one.py::test_one",))
    assert (fork.label, fork.first, fork.patches) == (FORK, 2, 2)
    assert fork.tests == ("tests/test_fork.py::test_fork", "tests/test_fork.py::test_other")
    assert "2 test(s) of the test files they change pass" in fork.describe()


def test_a_failing_test_of_a_fork_only_patch_fails_the_stack(tmp_path: Path) -> None:
    repo, series = _repo(tmp_path, "def test_fork():\n    assert False, 'broken on the whole series'\n")
    with pytest.raises(UpstreamError, match=f"{FORK}: .* failed"):
        check_prefixes(repo, series, "base", timeout=300)
