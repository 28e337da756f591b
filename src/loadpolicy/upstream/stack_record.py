"""The record of the last full stack check, and whether it still describes the series.

Running every PR's tests on its own prefix takes 15-20 minutes here, longer than CI can give it beside the rest,
so CI runs the cheap part (every prefix imports; the standalone PRs' tests alone on the pristine sources) and checks
that the full check ran on exactly these patches: `tox -e stack` writes the record, naming what it checked by a
digest of the series under patches/ (each `series`, pin and patch, the DeepSpeed and PEFT series too); any change
since makes the record stale, and CI says so.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path

from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import Series


_DIGEST_LINE = "series sha256 "


# the files a series directory is made of; anything else there (an editor's backup) does not change what was checked
_SERIES_FILES = ("series", "UPSTREAM", "*.patch")


def series_digest(series: Series) -> str:
    """sha256 over the series' directory and those beneath it (the DeepSpeed and PEFT series, whose patched packages
    the PRs' tests run against): each one's `series`, pin and patches, by relative path."""
    directory = series.directory
    files = {path for pattern in _SERIES_FILES for path in directory.rglob(pattern) if path.is_file()}
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def write_record(path: Path, series: Series, lines: list[str]) -> None:
    today = datetime.date.today().isoformat()
    header = [
        f"{_DIGEST_LINE}{series_digest(series)}",
        f"# `loadpolicy dev series stack` with every PR's tests, {today}: each PR's prefix (or its patches alone)",
    ]
    path.write_text("\n".join([*header, *lines]) + "\n", encoding="utf-8")


def require_current_record(path: Path, series: Series) -> str:
    """The record's digest line, or an error saying the full stack has not run on these patches."""
    if not path.is_file():
        raise UpstreamError(f"no record of the full stack check at {path}: run `tox -e stack`, which writes it")
    lines = path.read_text(encoding="utf-8").splitlines()
    recorded = lines[0].removeprefix(_DIGEST_LINE) if lines and lines[0].startswith(_DIGEST_LINE) else None
    current = series_digest(series)
    if recorded != current:
        raise UpstreamError(
            f"{path} records the full stack check of series {recorded!r}, but the series is now {current!r}: "
            "a patch or the series changed since every PR's tests last ran on its prefix; run `tox -e stack`"
        )
    return lines[0]
