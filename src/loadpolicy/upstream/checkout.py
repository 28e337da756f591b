"""`loadpolicy checkout DIR`: the pinned sdist, verified, unpacked as a git repository, with the series applied."""

from __future__ import annotations

from pathlib import Path

from loadpolicy.upstream.fetch import fetch_sdist, unpack
from loadpolicy.upstream.git import PRISTINE_ENV, git
from loadpolicy.upstream.pin import Pin, read_pin
from loadpolicy.upstream.series import apply_series, lint_series, read_series, require_clean


BRANCH = "loadpolicy"


def pristine_tag(pin: Pin) -> str:
    return f"upstream/{pin.version}"


def checkout(dest: Path, patches: Path, cache: Path, *, apply: bool = True) -> Pin:
    """Make `dest` a git repository: the pristine tree as the first (tagged) commit, then the series on top."""
    pin = read_pin(patches / "UPSTREAM")
    series = read_series(patches)
    require_clean(lint_series(series))
    unpack(fetch_sdist(pin, cache), pin, dest)
    git(dest, "init", "--quiet", "--initial-branch", BRANCH)
    git(dest, "add", "--all", "--force")
    git(dest, "commit", "--quiet", "--no-verify", "-m", f"{pin.name} {pin.version} (pristine sdist)", env=PRISTINE_ENV)
    git(dest, "tag", pristine_tag(pin))
    if apply:
        apply_series(dest, series)
    return pin
