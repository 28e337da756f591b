"""Every pull request of the stack on its own, with the tests it adds.

A maintainer merges PR 1, then PR 2 on top of it, and so on, so each prefix of the series that ends a PR must stand
by itself: it imports, the files the PR touches pass the tree's own `ruff check` and `ruff format --check` (its CI's
first job), and the tests that PR adds pass on it (a test that needs a later PR belongs to that one). A PR
whose patches say `Needs: none` is checked on the pristine sources with only its own patches: it can be merged first,
alone, in any order with the others. The full series runs every test in `tox -e patches` already.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.git import git
from loadpolicy.upstream.pin import Pin, UpstreamError, read_pin
from loadpolicy.upstream.prefix_style import python_files_changed, ruff_for, style_problems
from loadpolicy.upstream.series import Series


@dataclass(frozen=True, slots=True)
class PrefixResult:
    label: str
    first: int  # the PR's patches, 1-based and inclusive
    patches: int
    tests: tuple[str, ...]
    seconds: float
    alone: bool  # checked on the pristine sources with its own patches only
    tests_ran: bool = True  # False: its tests left to the full check
    against: str = ""  # the DeepSpeed its tests ran against, where not the running environment's
    earlier_tests: int = 0  # the tests of the PRs before it, run with its own at its place in the series

    def describe(self) -> str:
        where = (
            f"patches {self.first}-{self.patches} alone on the pristine sources"
            if self.alone
            else (f"patches 1-{self.patches}")
        )
        where += f" against {self.against}" if self.against else ""
        tests = (
            f"its {len(self.tests)} test(s) pass" if self.tests_ran else f"its {len(self.tests)} test(s) not run here"
        )
        if self.earlier_tests:
            tests += f", and with the {self.earlier_tests} of the PRs before it at patches 1-{self.patches}"
        return f"{self.label}: {where} apply, import and pass the tree's ruff; {tests} ({self.seconds:.0f}s)"


def node_ids_in_source(source: str, path: str) -> set[str]:
    """pytest node ids of the tests in one file's source: `path::Class::test_x` and `path::test_y`."""
    ids: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            ids.update(
                f"{path}::{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test_")
            )
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            ids.add(f"{path}::{node.name}")
    return ids


def _tests_at(tree: Path, base: str, commit: str) -> set[str]:
    """The tests of every test file the series has added or changed by `commit`."""
    changed = git(tree, "diff", "--name-only", base, commit, "--", "tests").stdout.split()
    ids: set[str] = set()
    for path in changed:
        if Path(path).name.startswith("test_") and path.endswith(".py"):
            ids |= node_ids_in_source(git(tree, "show", f"{commit}:{path}").stdout, path)
    return ids


# A rank that ends by C++ `std::terminate` at exit, after its result was written: seen on PR 2's error tests under
# CI only (2 of 2 CI runs, 1 of 8 runs by hand), where a rank leaves gloo with a collective of the failed load pending
EXIT_ABORT = "terminate called without an active exception"


def _run(command: list[str], worktree: Path, label: str, timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(worktree / "src"), "OMP_NUM_THREADS": "1"}
    # the worktree runs from source: let its bytecode be cached, or every rank of every launch compiles transformers
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    try:
        done = subprocess.run(command, cwd=worktree, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0 and EXIT_ABORT in done.stdout + done.stderr:  # once more, and said so
            print(f"{label}: a rank aborted at exit ({EXIT_ABORT!r}); running its tests once more", flush=True)
            done = subprocess.run(command, cwd=worktree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise UpstreamError(f"{label}: `{' '.join(command[:6])} ...` did not finish within {timeout:.0f}s") from exc
    if done.returncode != 0:
        raise UpstreamError(f"{label}: `{' '.join(command[:6])} ...` failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def _modules_changed(changed: list[str]) -> list[str]:
    """`transformers.x.y` for each module under src/ among the `.py` files `changed` (what a probe imports)."""
    return sorted(
        p.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for p in changed
        if p.startswith("src/transformers/")
    )


def _worktree(tree: Path, base: str, commits: list[str], first: int, end: int, alone: bool) -> Path:
    """A worktree at the PR's last patch, or (alone) at `base` with only the PR's patches cherry-picked."""
    worktree = tree.parent / f"{tree.name}-prefix-{end:04d}"
    git(tree, "worktree", "add", "--force", "--detach", str(worktree), base if alone else commits[end - 1])
    if alone:
        picked = git(worktree, "cherry-pick", *commits[first - 1 : end], check=False)
        if picked.returncode:
            git(tree, "worktree", "remove", "--force", str(worktree))
            raise UpstreamError(f"patches {first}-{end} do not apply alone to {base}:\n{picked.stderr.strip()}")
    return worktree


def check_prefixes(
    tree: Path,
    series: Series,
    base: str,
    timeout: float = 1200.0,
    standalone_tests_only: bool = False,
    released: tuple[Path, str] | None = None,
    every_earlier_test: bool = False,
) -> list[PrefixResult]:
    """For each PR: a worktree at its last patch (or its patches alone on `base`); it imports, and its tests pass.

    `standalone_tests_only`: run the tests of the PRs checked alone on `base` only; the others' prefixes are imported,
    their tests left to the full check (`tox -e stack`) and to the run of every test on the whole series.
    `released`: an interpreter and what it has (`released.released_deepspeed_python`, the DeepSpeed release) that
    imports and tests the PRs checked alone, which must not need the DeepSpeed series.
    `every_earlier_test`: at each PR's place in the series (patches 1 to its last), the tests of every PR before it
    run with its own, as a maintainer's CI runs every test once the PR is merged; for a PR also checked alone, that is
    a second worktree (against `released` while every PR so far needs nothing).
    """
    commits = git(tree, "rev-list", "--reverse", f"{base}..HEAD").stdout.split()
    if len(commits) != len(series.names):
        raise UpstreamError(f"{tree} has {len(commits)} commits on {base}, the series {len(series.names)} patches")
    results, first, all_alone = [], 1, True
    earlier: list[str] = []  # the tests of the PRs checked so far
    for label, end in series.pull_requests():
        started, alone = time.monotonic(), series.needs_nothing(label)
        all_alone = all_alone and alone
        before = _tests_at(tree, base, commits[first - 2]) if first > 1 else set()
        added = sorted(_tests_at(tree, base, commits[end - 1]) - before)
        ran = alone or not standalone_tests_only
        python, against = released if alone and released else (Path(sys.executable), "")
        worktree = _worktree(tree, base, commits, first, end, alone)
        try:
            changed = python_files_changed(tree, commits[first - 1 : end])
            modules = ["transformers", *_modules_changed(changed)]
            _run([str(python), "-c", f"import {', '.join(modules)}"], worktree, label, timeout)
            if problems := style_problems(worktree, changed, ruff_for(worktree)):
                where = "alone on the pristine sources" if alone else f"on patches 1-{end}"
                raise UpstreamError(f"{label}, {where}, fails the tree's own ruff:\n" + "\n".join(problems))
            with_earlier = every_earlier_test and ran and not alone
            if tests := [*earlier, *added] if with_earlier else added if ran else []:
                _pass(_pytest(worktree, tests, label, timeout, python), label)
        finally:
            git(tree, "worktree", "remove", "--force", str(worktree))
        if every_earlier_test and ran and alone and earlier:
            in_series = _worktree(tree, base, commits, first, end, alone=False)
            try:
                in_python = python if all_alone else Path(sys.executable)
                _pass(_pytest(in_series, [*earlier, *added], f"{label} at patches 1-{end}", timeout, in_python), label)
            finally:
                git(tree, "worktree", "remove", "--force", str(in_series))
        seconds = time.monotonic() - started
        ran_earlier = len(earlier) if every_earlier_test and ran else 0
        results.append(
            PrefixResult(label, first, end, tuple(added), seconds, alone, ran, against if ran else "", ran_earlier)
        )
        earlier += added
        first = end + 1
    return results


def _pass(summary: str, label: str) -> None:
    if "skipped" in summary:  # a test that did not run is not a pass
        raise UpstreamError(f"{label}: some of its tests were skipped ({summary}); run with RUN_SLOW=1")


def upstream_bound_series(patches: Path, pin: Pin) -> list[Path]:
    """The series beside the main one that propose more transformers PRs on the same pristine sources
    (`patches/upstream-ep`), in name order; the DeepSpeed and PEFT series patch other packages."""
    return [
        listing.parent
        for listing in sorted(patches.glob("*/series"))
        if (listing.parent / "UPSTREAM").is_file() and read_pin(listing.parent / "UPSTREAM") == pin
    ]


# Where the series keeps its tests in transformers' layout (the sdist has none of these folders of its own)
SERIES_TEST_DIRS = ("tests/deepspeed", "tests/distributed", "tests/utils")


def run_series_tests(tree: Path, timeout: float) -> str:
    """Every test the series adds, on `tree` as checked out: pytest's summary line, or an error with its output."""
    folders = [folder for folder in SERIES_TEST_DIRS if (tree / folder).is_dir()]
    return _pytest(tree, folders, f"tests on {tree}", timeout)


def _pytest(tree: Path, tests: list[str], label: str, timeout: float, python: Path | None = None) -> str:
    """pytest on `tests` of `tree` (by `python`, the running interpreter by default), with the tree's own
    configuration: its summary line."""
    command = [str(python or sys.executable), "-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", str(tree)]
    output = _run([*command, "-c", str(tree / "pyproject.toml"), *tests], tree, label, timeout)
    return output.strip().splitlines()[-1] if output.strip() else ""
