"""The record of the last full stack check, and whether it still describes the series.

Running every PR's tests on its own prefix takes 15-20 minutes here, longer than CI can give it beside the rest, so
CI checks that the full check ran on exactly these patches and versions instead: `tox -e stack` writes the record,
naming what it checked by a digest (`series_digest`) taken before it ran and checked again after; any change since
makes the record stale, and `series lint --require-stack-record`, CI's first command, says so.
"""

from __future__ import annotations

import datetime
import hashlib
import tempfile
from pathlib import Path

from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import FORK_ONLY, Series, export_series, read_series


_DIGEST_LINE = "series sha256 "


def series_digest(series: Series) -> str:
    """sha256 over what the full check ran: the pin, each PR's label and patches in order (the fork-only patches,
    which no PR's prefix holds, left out), and every series beneath (the DeepSpeed and PEFT series, whose patched
    packages the PRs' tests run against), each its `series`, pin and the patches it lists, and the pinned versions
    the tests ran with (`pins/constraints.txt` beside the series' folder, where there is one). Files not listed (an
    editor's backup) do not count."""
    digest = hashlib.sha256()

    def add(path: Path) -> None:
        digest.update(path.relative_to(series.directory).as_posix().encode() + b"\0" + path.read_bytes())

    add(series.directory / "UPSTREAM")
    if (constraints := series.directory.parent / "pins" / "constraints.txt").is_file():
        digest.update(b"../pins/constraints.txt\0" + constraints.read_bytes())
    for label, names in series.groups:
        if not label.startswith(FORK_ONLY):
            digest.update(label.encode() + b"\0")
            for name in names:
                add(series.directory / name)
    for listing in sorted(series.directory.glob("*/series")):
        nested = read_series(listing.parent)
        for path in (listing, listing.parent / "UPSTREAM", *nested.paths):
            add(path)
    return digest.hexdigest()


def write_record(path: Path, series: Series, digest: str, lines: list[str]) -> None:
    """Record a full check that ran on the series named by `digest` (taken before it ran)."""
    if (now := series_digest(series)) != digest:
        raise UpstreamError(f"the series changed while the stack was checked ({digest} -> {now}): run it again")
    today = datetime.date.today().isoformat()
    header = [
        f"{_DIGEST_LINE}{digest}",
        f"# `loadpolicy dev series stack` with every PR's tests, {today}: each PR's prefix (or its patches alone)",
    ]
    path.write_text("\n".join([*header, *lines]) + "\n", encoding="utf-8")


def require_current_record(path: Path, series: Series) -> str:
    """The record's digest line, or an error saying the full stack has not run on these patches."""
    if not path.is_file():
        raise UpstreamError(f"no record of the full stack check at {path}: run `tox -e stack`, which writes it")
    first = next(iter(path.read_text(encoding="utf-8").splitlines()), "")
    if not first.startswith(_DIGEST_LINE):
        raise UpstreamError(
            f"{path} begins {first[:80]!r}, not `{_DIGEST_LINE}<hex>`: it is not a record `tox -e stack` wrote; "
            "run `tox -e stack`"
        )
    recorded, current = first.removeprefix(_DIGEST_LINE), series_digest(series)
    if recorded != current:
        raise UpstreamError(
            f"{path} records the full stack check of series {recorded}, but the series is now {current}: "
            "a PR's patch, the pin, the pinned versions or the DeepSpeed or PEFT series changed since every PR's "
            "tests last ran on its prefix; run `tox -e stack`"
        )
    return first


def require_tree_is_series(tree: Path, base: str, series: Series) -> None:
    """The checked tree's commits re-export to exactly the series' patches, so a record names what ran."""
    with tempfile.TemporaryDirectory() as tmp:
        exported = export_series(tree, base, Path(tmp))
        differ = [
            name
            for name in series.names
            if name not in exported or (Path(tmp) / name).read_bytes() != (series.directory / name).read_bytes()
        ]
    if exported != list(series.names) or differ:
        raise UpstreamError(
            f"{tree}'s commits are not the series in {series.directory} (differ: {differ or 'the list of patches'}): "
            "a record of its check would name other patches; check out the series (`loadpolicy checkout`) or export "
            "the tree first"
        )
