"""The patch series: `patches/series` lists `git format-patch` files in order; lint, apply and export them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.git import git
from loadpolicy.upstream.pin import UpstreamError


# DEP-3 trailers every patch carries (https://dep-team.pages.debian.net/deps/dep3/).
REQUIRED_TRAILERS = ("Origin", "Forwarded", "Last-Update")
_PATCH_NAME = re.compile(r"\d{4}-[A-Za-z0-9._-]+\.patch")
_FAILED_FILE = re.compile(r"^error: (?:patch failed: (?P<file>.+?):\d+|(?P<missing>.+?): does not exist in index)$")


@dataclass(frozen=True, slots=True)
class Series:
    directory: Path
    names: tuple[str, ...]

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(self.directory / name for name in self.names)


def read_series(directory: Path) -> Series:
    lines = (directory / "series").read_text(encoding="utf-8").splitlines()
    names = tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
    return Series(directory=directory.resolve(), names=names)


def lint_series(series: Series) -> list[str]:
    """Problems with the series itself: listing, file names, headers (applying is checked by `apply_series`)."""
    problems: list[str] = []
    seen: set[str] = set()
    for name in series.names:
        if name in seen:
            problems.append(f"series: {name} is listed twice")
        seen.add(name)
        if not _PATCH_NAME.fullmatch(name):
            problems.append(f"series: {name} is not named NNNN-subject.patch")
        path = series.directory / name
        if not path.is_file():
            problems.append(f"series: {name} is listed but does not exist")
            continue
        problems.extend(f"{name}: {problem}" for problem in _header_problems(path.read_text(encoding="utf-8")))
    problems.extend(
        f"{path.name}: exists but is not listed in series"
        for path in sorted(series.directory.glob("*.patch"))
        if path.name not in seen
    )
    return problems


def _header_problems(text: str) -> list[str]:
    header, sep, _ = text.partition("\n---\n")
    if not sep or not header.startswith("From 0000000000000000000000000000000000000000 "):
        return ["not a `git format-patch --zero-commit` file"]
    problems = [] if re.search(r"^Subject: .+", header, re.MULTILINE) else ["no Subject"]
    problems.extend(
        f"missing DEP-3 trailer `{trailer}:`"
        for trailer in REQUIRED_TRAILERS
        if not re.search(rf"^{trailer}: \S", header, re.MULTILINE)
    )
    return problems


def apply_series(repo: Path, series: Series) -> None:
    """`git am --3way` each patch in order; a failure names the patch and the files that did not apply."""
    for path in series.paths:
        # `git apply --check` first: a patch must apply exactly, not merely through a 3-way merge.
        check = git(repo, "apply", "--check", str(path), check=False)
        result = check if check.returncode else git(repo, "am", "--3way", "--keep-cr", str(path), check=False)
        if result.returncode:
            if not check.returncode:
                git(repo, "am", "--abort", check=False)
            files = sorted(
                {m["file"] or m["missing"] for line in result.stderr.splitlines() if (m := _FAILED_FILE.match(line))}
            )
            where = ", ".join(files) if files else "(git did not name a file)"
            raise UpstreamError(f"patch {path.name} does not apply: {where}\n{result.stderr.strip()}")


def export_series(repo: Path, base: str, directory: Path) -> list[str]:
    """Write `base..HEAD` of `repo` as the series in `directory`, byte-identically for an unchanged branch."""
    directory = directory.resolve()
    for old in directory.glob("*.patch"):
        old.unlink()
    result = git(
        repo,
        "-c",
        "diff.noprefix=false",
        "-c",
        "diff.mnemonicPrefix=false",
        "-c",
        "format.signOff=false",
        "format-patch",
        "--zero-commit",
        "--no-signature",
        "--no-numbered",
        "--full-index",
        "--no-renames",
        "--diff-algorithm=myers",
        "--stat=119",
        "--output-directory",
        str(directory),
        f"{base}..HEAD",
    )
    names = [Path(line).name for line in result.stdout.splitlines() if line.strip()]
    (directory / "series").write_text("".join(f"{name}\n" for name in names), encoding="utf-8")
    return names


def require_clean(problems: list[str]) -> None:
    if problems:
        raise UpstreamError("patch series problems:\n" + "\n".join(f"  {problem}" for problem in problems))
