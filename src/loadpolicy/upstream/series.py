"""The patch series: `patches/series` lists `git format-patch` files in order; lint, apply and export them.

The series is a stack of pull requests. Every patch names its place with a `Stack:` trailer, either `PR N: title`
(the upstream pull request it belongs to; PR N builds on PRs 1..N-1) or `fork-only: reason` (kept in our fork, with
why it is not proposed). `series` lists them in stack order, a `# <stack>` comment line before each group; `series
export` writes those lines from the trailers, and `series lint` checks that the two agree and that the groups are in
order: PR 1, PR 2, ..., then the fork-only patches.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.git import git
from loadpolicy.upstream.pin import UpstreamError, no_series_error


# DEP-3 trailers every patch carries (https://dep-team.pages.debian.net/deps/dep3/).
REQUIRED_TRAILERS = ("Origin", "Forwarded", "Last-Update", "Stack")
_STACK = re.compile(r"^Stack: (?P<label>.+)$", re.MULTILINE)
_PR_LABEL = re.compile(r"PR (?P<number>\d+): \S.*")
FORK_ONLY = "fork-only: "
# `Needs: none`: the patch applies to the pristine sources without any other patch of the series
_NEEDS_NOTHING = re.compile(r"^Needs: none$", re.MULTILINE)
_PATCH_NAME = re.compile(r"\d{4}-[A-Za-z0-9._-]+\.patch")
_FAILED_FILE = re.compile(r"^error: (?:patch failed: (?P<file>.+?):\d+|(?P<missing>.+?): does not exist in index)$")


@dataclass(frozen=True, slots=True)
class Series:
    directory: Path
    names: tuple[str, ...]
    # (the `# ...` line of `series`, the patches listed under it), in order
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(self.directory / name for name in self.names)

    def needs_nothing(self, label: str) -> bool:
        """Whether every patch of the group `label` says `Needs: none`: it applies to the pristine sources alone."""
        names = next((names for group, names in self.groups if group == label), ())
        return bool(names) and all(
            _NEEDS_NOTHING.search((self.directory / name).read_text(encoding="utf-8").partition("\n---\n")[0])
            for name in names
        )

    def pull_requests(self) -> list[tuple[str, int]]:
        """Each PR group's label and the number of patches up to and including it: the prefixes to check."""
        prefixes, end = [], 0
        for label, names in self.groups:
            end += len(names)
            if _PR_LABEL.fullmatch(label):
                prefixes.append((label, end))
        return prefixes


def read_series(directory: Path) -> Series:
    if not (directory / "series").is_file():
        raise no_series_error(directory)
    lines = (directory / "series").read_text(encoding="utf-8").splitlines()
    names: list[str] = []
    groups: list[tuple[str, list[str]]] = []
    for line in (line.strip() for line in lines):
        if line.startswith("#"):
            groups.append((line.lstrip("# "), []))
        elif line:
            names.append(line)
            if groups:
                groups[-1][1].append(line)
    return Series(directory.resolve(), tuple(names), tuple((label, tuple(group)) for label, group in groups))


def stack_label(patch: str) -> str | None:
    """The `Stack:` trailer of a `git format-patch` file's header, if any."""
    header = patch.partition("\n---\n")[0]
    match = _STACK.search(header)
    return None if match is None else match["label"].strip()


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
    return problems + _stack_problems(series)


def _stack_problems(series: Series) -> list[str]:
    """Every patch under the `# label` line its `Stack:` trailer names; PR 1, 2, ... in order, then fork-only."""
    grouped = [name for _, names in series.groups for name in names]
    if grouped != list(series.names):
        return ["series: every patch must be listed under a `# PR N: ...` or `# fork-only: ...` line"]
    problems = []
    numbers = []
    for index, (label, names) in enumerate(series.groups):
        pull_request = _PR_LABEL.fullmatch(label)
        if pull_request is None and not label.startswith(FORK_ONLY):
            problems.append(f"series: `# {label}` is neither `PR N: title` nor `{FORK_ONLY}reason`")
        if pull_request is not None:
            numbers.append(int(pull_request["number"]))
            if any(other.startswith(FORK_ONLY) for other, _ in series.groups[:index]):
                problems.append(f"series: `# {label}` comes after a fork-only group; proposed PRs come first")
        for name in names:
            path = series.directory / name
            if path.is_file() and (found := stack_label(path.read_text(encoding="utf-8"))) != label:
                problems.append(f"{name}: its Stack trailer says {found!r}, the series lists it under {label!r}")
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"series: the PRs are numbered {numbers}; expected 1, 2, ... in order, each once")
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
    """Write `base..HEAD` of `repo` as the series in `directory`, byte-identically for an unchanged branch.

    Nothing in `directory` changes until git has written every patch: they go to a staging folder first, and replace
    the old patches and `series` only then.
    """
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if git(repo, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", check=False).returncode:
        raise UpstreamError(
            f"{str(repo)!r} is not a git checkout with the pristine tag {base!r}; accepted: a checkout made by "
            "`loadpolicy checkout DIR`, with the series edited on its branch"
        )
    with tempfile.TemporaryDirectory(prefix=".export-", dir=directory) as staging:
        names = _format_patches(repo, base, Path(staging))
        for old in directory.glob("*.patch"):
            old.unlink()
        for name in [*names, "series"]:
            os.replace(Path(staging) / name, directory / name)
    return names


def _format_patches(repo: Path, base: str, directory: Path) -> list[str]:
    """`git format-patch` of `base..HEAD` into `directory`, with the `series` file that lists them by stack."""
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
    lines, current = [], None
    for name in names:
        label = stack_label((directory / name).read_text(encoding="utf-8"))
        if label != current:
            lines.append(f"# {label}")
            current = label
        lines.append(name)
    (directory / "series").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return names


def require_clean(problems: list[str]) -> None:
    if problems:
        raise UpstreamError("patch series problems:\n" + "\n".join(f"  {problem}" for problem in problems))


@dataclass(frozen=True, slots=True)
class GroupSize:
    """One group of the series (a PR or a fork-only reason): its patches and the lines they add and remove."""

    label: str
    patches: int
    source_added: int
    source_removed: int
    tests_added: int
    alone: bool  # applies to the pristine sources without the rest of the series (`Needs: none`)


def group_sizes(series: Series) -> list[GroupSize]:
    """Lines each group adds and removes in source (all but tests/ and docs/) and adds under tests/, from its hunks."""
    sizes = []
    for label, names in series.groups:
        counts = {"src+": 0, "src-": 0, "tests+": 0}
        for name in names:
            path = None
            for line in (series.directory / name).read_text(encoding="utf-8").split("\n---\n", 1)[1].splitlines():
                if line.startswith("diff --git "):
                    path = line.split(" b/", 1)[1]
                elif path is None or line.startswith(("+++ ", "--- ")):
                    continue
                elif line.startswith(("+", "-")):
                    where = "tests" if path.startswith("tests/") else "" if path.startswith("docs/") else "src"
                    key = f"{where}{line[0]}"
                    if key in counts:
                        counts[key] += 1
        alone = series.needs_nothing(label)
        sizes.append(GroupSize(label, len(names), counts["src+"], counts["src-"], counts["tests+"], alone))
    return sizes
