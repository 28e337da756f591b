"""Rebase the series onto another transformers release and show what changed with `git range-diff`."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.checkout import BRANCH, pristine_tag
from loadpolicy.upstream.fetch import unpack
from loadpolicy.upstream.git import PRISTINE_ENV, git
from loadpolicy.upstream.pin import Pin


@dataclass(frozen=True, slots=True)
class RefreshResult:
    target: Pin
    applied: bool
    report: str  # `git range-diff` when every patch applied, else which patch and files stopped the rebase


def refresh(repo: Path, pin: Pin, target: Pin, cache: Path) -> RefreshResult:
    """In a checkout made by `checkout`, commit `target`'s pristine tree and rebase the series branch onto it."""
    new_tag, branch = pristine_tag(target), f"{BRANCH}-{target.version}"
    with tempfile.TemporaryDirectory() as tmp:
        tree = unpack(cache / target.sdist, target, Path(tmp) / "tree")
        git(repo, "checkout", "--quiet", "--orphan", f"upstream-{target.version}")
        git(repo, "rm", "-r", "--quiet", "--cached", ".")
        git(repo, "clean", "-fdxq")
        for item in tree.iterdir():
            shutil.move(item, repo / item.name)
    git(repo, "add", "--all", "--force")
    git(
        repo,
        "commit",
        "--quiet",
        "--no-verify",
        "-m",
        f"{target.name} {target.version} (pristine sdist)",
        env=PRISTINE_ENV,
    )
    git(repo, "tag", new_tag)
    git(repo, "checkout", "--quiet", "-B", branch, BRANCH)
    rebase = git(repo, "rebase", "--onto", new_tag, pristine_tag(pin), branch, check=False)
    if rebase.returncode:
        stopped = git(repo, "log", "-1", "--format=%s", "REBASE_HEAD", check=False).stdout.strip()
        conflicts = git(repo, "diff", "--name-only", "--diff-filter=U", check=False).stdout.split()
        git(repo, "rebase", "--abort", check=False)
        report = f"patch {stopped!r} does not apply to {target.version}: conflicts in {', '.join(conflicts) or '?'}"
        return RefreshResult(target=target, applied=False, report=report)
    old_range, new_range = f"{pristine_tag(pin)}..{BRANCH}", f"{new_tag}..{branch}"
    range_diff = git(repo, "range-diff", "--no-color", old_range, new_range).stdout
    return RefreshResult(target=target, applied=True, report=range_diff)
