"""Run git with a fixed, deterministic configuration (no user config can change what the series looks like)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from loadpolicy.upstream.pin import UpstreamError


# Identity and dates of the pristine upstream commit: fixed so its hash is the same on every machine.
PRISTINE_ENV = {
    "GIT_AUTHOR_NAME": "upstream",
    "GIT_AUTHOR_EMAIL": "upstream@loadpolicy.invalid",
    "GIT_COMMITTER_NAME": "upstream",
    "GIT_COMMITTER_EMAIL": "upstream@loadpolicy.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
_ISOLATED_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_COMMITTER_NAME": "loadpolicy",
    "GIT_COMMITTER_EMAIL": "loadpolicy@loadpolicy.invalid",
    "LC_ALL": "C",
}


def git(
    repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if not repo.is_dir():
        raise UpstreamError(f"{str(repo)!r} is not a directory; accepted: a git checkout (`loadpolicy checkout DIR`)")
    full_env = {**os.environ, **_ISOLATED_ENV, **(env or {})}
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env=full_env, check=False)
    if check and result.returncode != 0:
        raise UpstreamError(
            f"git {' '.join(args)} failed in {repo}:\n{result.stderr.strip() or result.stdout.strip()}"
        )
    return result
