"""The pinned upstream release: `patches/UPSTREAM` (name, version, sdist file name, sha256)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.errors import CommandError


class UpstreamError(CommandError):
    """Fetching, verifying or patching the upstream source failed; the message says where."""


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str
    sdist: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


_SHA256 = re.compile(r"[0-9a-f]{64}")


def no_series_error(directory: Path) -> UpstreamError:
    return UpstreamError(
        f"no patch series at {str(directory)!r} (it needs UPSTREAM and series); accepted: run from the loadpolicy "
        "repository, or pass --patches DIR (the repository's patches/)"
    )


def read_pin(path: Path) -> Pin:
    if not path.is_file():
        raise no_series_error(path.parent)
    fields: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UpstreamError(f"{path}:{number}: expected `key = value`, got {line!r}")
        fields[key.strip()] = value.strip()
    missing = {"name", "version", "sdist", "sha256"} - fields.keys()
    if missing:
        raise UpstreamError(f"{path}: missing {', '.join(sorted(missing))}")
    if not _SHA256.fullmatch(fields["sha256"]):
        raise UpstreamError(f"{path}: sha256 must be 64 lowercase hex digits, got {fields['sha256']!r}")
    return Pin(name=fields["name"], version=fields["version"], sdist=fields["sdist"], sha256=fields["sha256"])
