"""`loadpolicy dev mutants --check-table CHECKOUT`: in seconds, without running a check, that the table still holds.

Three things the table's verdicts rest on, which a change of the series, of the tests or of the harness can take away
unseen between two whole runs: every row's text is found once where it says, in a patched checkout (our package, the
installed PEFT and DeepSpeed for theirs); every check a row names selects something that exists today (the in-tree or
unit test function, the bad-input case, the matrix run, the parity case's architecture); and every row has a record,
of the row as it is, of its check's baseline running the mutated lines (`paths`). `tox -e patches` runs it on the
checkout it makes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from loadpolicy.errors import CommandError
from loadpolicy_lab.faults.cases import FAULT_CASES
from loadpolicy_lab.matrix.cases import full_matrix
from loadpolicy_lab.models.architectures import ARCHITECTURES
from loadpolicy_lab.validate.mutants.checks import (
    IN_TREE_FOLDERS,
    OUR_PACKAGE,
    Check,
    Target,
    defined_tests,
    in_tree_files,
    installed_package,
)
from loadpolicy_lab.validate.mutants.paths import read_record, record_problems
from loadpolicy_lab.validate.mutants.row import Mutation
from loadpolicy_lab.validate.mutants.run import selected_rows
from loadpolicy_lab.validate.mutants.table import ALL_ROWS


# the unit tests a row's expected reason names (`FAILED \S*::test_name`, or several)
_NAMED_TEST = re.compile(r"\btest_\w+")


class TableCheckError(CommandError):
    """A row no longer applies, names a check that selects nothing, or has no record of being on its check's path."""


def check_table(checkout: Path, tests: Path, record: Path, only: list[str]) -> list[str]:
    """Every problem of the selected rows (all when `only` is empty): text, selection, record."""
    rows = selected_rows(only) if only else list(ALL_ROWS)  # every row, those at a published width too
    roots = package_roots(checkout)
    problems = text_problems(rows, roots)
    problems += selection_problems(rows, tree_tests(checkout), tests)
    problems += record_problems(rows, read_record(record), known=[m.name for m in ALL_ROWS])
    return problems


def package_roots(checkout: Path) -> dict[Target, Path]:
    """Where each target's paths are relative to: the checkout's transformers, our package, the installed PEFT and
    DeepSpeed (with their series where the environment installs them)."""
    roots = {Target.TREE: checkout / "src" / "transformers", Target.POLICY: OUR_PACKAGE}
    for target in (Target.PEFT, Target.DEEPSPEED):
        if (package := installed_package(target)) is not None:
            roots[target] = package
    return roots


def text_problems(rows: Iterable[Mutation], roots: dict[Target, Path]) -> list[str]:
    """Each row whose text is not found exactly once in the file it names."""
    problems = []
    for mutation in rows:
        if mutation.target not in roots:
            problems.append(f"{mutation.name}: {mutation.target} is not installed here (its rows need its series)")
            continue
        path = roots[mutation.target] / mutation.path
        if not path.is_file():
            problems.append(f"{mutation.name}: {path} does not exist")
        elif (found := path.read_text(encoding="utf-8").count(mutation.old)) != 1:
            problems.append(f"{mutation.name}: its text is in {path} {found} times, expected once")
    return problems


def tree_tests(checkout: Path) -> set[str]:
    """The test functions of the checkout's folders an in-tree check selects from."""
    return {name for path in in_tree_files(checkout) for name in defined_tests(path)}


def selection_problems(rows: Iterable[Mutation], in_tree_tests: set[str], unit_tests: Path) -> list[str]:
    """Each row whose check would select nothing that exists today."""
    problems = []
    for mutation in rows:
        problems += [f"{mutation.name}: {why}" for why in _selects_nothing(mutation, in_tree_tests, unit_tests)]
    return problems


def _selects_nothing(mutation: Mutation, in_tree_tests: set[str], unit_tests: Path) -> list[str]:
    check: Check = mutation.check
    if check.in_tree is not None and check.in_tree not in in_tree_tests:
        return [f"no in-tree test is named {check.in_tree!r} (in {', '.join(IN_TREE_FOLDERS)})"]
    if check.fault is not None and check.fault not in {case.name for case in FAULT_CASES}:
        return [f"no bad-input case is named {check.fault!r}"]
    if check.run is not None and check.run not in full_matrix(sweep=True):
        return [f"{check.run.label} is no run of the load matrix"]
    if check.real_width is not None:
        return check.real_width.problems()
    if check.parity is not None and check.parity.arch not in ARCHITECTURES:
        return [f"no tiny architecture {check.parity.arch!r} for {check.parity.label}"]
    if check.unit_tests:
        files = [unit_tests / name for name in check.unit_tests]
        missing = [str(path) for path in files if not path.is_file()]
        if missing:
            return [f"no unit test file {missing}"]
        defined = {name for path in files for name in defined_tests(path)}
        if not defined:
            return [f"no test in {check.unit_tests}"]
        named = set(_NAMED_TEST.findall(mutation.expects)) - defined
        if named:
            return [f"its expected reason names {sorted(named)}, which {list(check.unit_tests)} do not define"]
    return []
