"""What a maintainer's CI runs first on a pull request: `ruff check` and `ruff format --check` with the tree's own
configuration and ruff version, on the Python files the PR's patches touch, at the prefix of the series that ends it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from loadpolicy.upstream.git import git
from loadpolicy.upstream.pin import UpstreamError


_PIN = re.compile(r"[\"']ruff==(?P<version>[\w.]+)[\"']")


def python_files_changed(tree: Path, commits: list[str]) -> list[str]:
    """The `.py` files the commits change, relative to the tree."""
    return sorted(
        {
            path
            for commit in commits
            for path in git(tree, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).stdout.split()
            if path.endswith(".py")
        }
    )


def ruff_for(worktree: Path) -> str:
    """The `ruff` on PATH if it is the version the tree pins (`setup.py`: `ruff==X`); else an error naming both."""
    ruff = shutil.which("ruff")
    setup = worktree / "setup.py"
    pinned = _PIN.search(setup.read_text(encoding="utf-8")) if setup.exists() else None
    wanted = f"ruff=={pinned['version']}" if pinned else "ruff"
    if ruff is None:
        raise UpstreamError(f"the stack check runs ruff as the tree's CI does: no ruff on PATH; accepted: {wanted}")
    found = subprocess.run([ruff, "--version"], capture_output=True, text=True, check=False).stdout.split()
    if pinned and found[-1:] != [pinned["version"]]:
        raise UpstreamError(f"{ruff} is ruff {' '.join(found[1:]) or '?'}; accepted: {wanted} (the tree's pin)")
    return ruff


def style_problems(worktree: Path, files: list[str], ruff: str) -> list[str]:
    """Where `ruff check` or `ruff format --check`, run in `worktree` with its configuration, fails on `files` (those
    present there): each command's first lines."""
    present = [name for name in files if (worktree / name).is_file()]
    if not present:
        return []
    problems = []
    for command in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        done = subprocess.run([ruff, *command, *present], cwd=worktree, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines()
            problems.append(f"ruff {command[0]}: " + "\n  ".join(lines[:8]))
    return problems
