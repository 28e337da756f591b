"""The mutation table's own judges: where a row's text runs (`paths.span_of`), the probe that sees it run in a real
process (`probe_hook`), the record of each row's path, and the fast check of the table (`table_check`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from loadpolicy_lab.parity.cases import ParityCase, Trainer
from loadpolicy_lab.perf.rounds import accepted_ways
from loadpolicy_lab.validate.mutants.checks import EXPORT, UNITS, Check, Target, in_tree
from loadpolicy_lab.validate.mutants.paths import (
    PROBE_MODULE,
    Span,
    install_probes,
    read_record,
    record_entry,
    record_problems,
    row_digest,
    span_of,
    where_it_ran,
    write_record,
)
from loadpolicy_lab.validate.mutants.real_width import RealWidth
from loadpolicy_lab.validate.mutants.row import Mutation
from loadpolicy_lab.validate.mutants.run import (
    Baseline,
    BaselineRun,
    MutationError,
    Outcome,
    Verdict,
    baselines_of,
    on_its_path,
)
from loadpolicy_lab.validate.mutants.table import ALL_ROWS
from loadpolicy_lab.validate.mutants.table_check import selection_problems, text_problems


UNIT_TESTS = Path(__file__).resolve().parent

MODULE = textwrap.dedent(
    '''\
    """A module a row mutates."""
    import threading

    LIMIT = 4  # a module constant


    def decorate(function):
        return function


    class Policy:
        reads = True  # a class attribute

        @decorate
        def saving(self):
            # the branch
            return "write" if self.reads else "gather"


    def called(x):
        y = x + 1
        return y


    # a comment between functions


    def never(x):
        return x - 1


    def in_a_thread():
        done = []
        worker = threading.Thread(target=lambda: done.append(threaded()))
        worker.start()
        worker.join()
        return done


    def threaded():
        return "from the thread"
    '''
)


def row(name: str, old: str, path: str = "module.py", check: Check = UNITS, new: str = "pass") -> Mutation:
    return Mutation(name, "a behaviour", Target.TREE, path, old, new, check, "a reason")


def line_of(text: str) -> int:
    return MODULE[: MODULE.index(text)].count("\n") + 1


def test_a_line_of_a_function_body_is_seen_when_it_runs() -> None:
    assert span_of(MODULE, "y = x + 1") == Span(frozenset({line_of("y = x + 1")}), at_import=False)
    # a piece that starts in a comment line above a function's first statement: that statement
    old = "the branch\n        return"
    assert span_of(MODULE, old).lines == {line_of('return "write"')}


def test_a_decorator_stands_for_the_body_of_the_function_it_decorates() -> None:
    # the body's lines from its first statement (a comment line never shows)
    span = span_of(MODULE, "    @decorate\n")
    assert span == Span(frozenset({line_of('return "write"')}), at_import=False)


def test_module_and_class_level_code_runs_at_import_and_a_comment_line_not_at_all() -> None:
    assert span_of(MODULE, "reads = True") == Span(frozenset(), at_import=True)
    assert span_of(MODULE, "LIMIT = 4") == Span(frozenset(), at_import=True)
    assert span_of(MODULE, '"""A module a row mutates."""') == Span(frozenset(), at_import=True)
    assert span_of(MODULE, "# a comment between functions") == Span(frozenset(), at_import=False)


def _probed_process(tmp_path: Path, calls: str, rows: list[Mutation]) -> Path:
    """A real process importing MODULE with the probe of `rows` appended, as a baseline's copy has it."""
    package, folder = tmp_path / "pkg", tmp_path / "probes"
    package.mkdir()
    (package / "module.py").write_text(MODULE, encoding="utf-8")
    install_probes(package, package, rows, folder)
    script = f"import sys; sys.path.insert(0, {str(package)!r}); import module; {calls}"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    return folder


def test_the_probe_records_the_rows_whose_lines_ran_in_a_real_process(tmp_path: Path) -> None:
    rows = [
        row("called", "y = x + 1"),
        row("never", "return x - 1"),
        row("class-attribute", "reads = True"),
        row("decorated", "    @decorate\n"),
        row("threaded", 'return "from the thread"'),
    ]
    folder = _probed_process(tmp_path, "module.called(1); module.Policy().saving(); module.in_a_thread()", rows)
    assert (tmp_path / "pkg" / f"{PROBE_MODULE}.py").exists()
    assert where_it_ran(folder, "called").startswith(f"line {line_of('y = x + 1')} (pid ")
    assert where_it_ran(folder, "class-attribute").startswith("at import (pid ")
    branch = line_of('return "write"')
    assert where_it_ran(folder, "decorated").startswith(f"line {branch} (pid ")
    assert where_it_ran(folder, "threaded").startswith("line ")
    assert where_it_ran(folder, "never") == ""


def test_the_probe_sees_nothing_where_nothing_is_called(tmp_path: Path) -> None:
    folder = _probed_process(tmp_path, "pass", [row("called", "y = x + 1"), row("decorated", "    @decorate\n")])
    assert (where_it_ran(folder, "called"), where_it_ran(folder, "decorated")) == ("", "")


def test_a_row_s_digest_follows_its_code_text_and_check_not_its_words() -> None:
    base = row("r", "y = x + 1", check=EXPORT)
    assert row_digest(base) == row_digest(replace(base, breaks="other words", expects="another reason"))
    for changed in (
        replace(base, old="y = x"),
        replace(base, new="y = x + 2"),
        replace(base, path="other.py"),
        replace(base, target=Target.PEFT),
        replace(base, check=replace(EXPORT, parity=ParityCase("mixtral", 4, Trainer.DEEPSPEED, export=True))),
    ):
        assert row_digest(changed) != row_digest(base), changed
    # a field named with its default value is the same check as one that leaves it out
    assert EXPORT.parity is not None
    explicit = replace(EXPORT, parity=replace(EXPORT.parity, export_unshared=False, lora=False))
    assert row_digest(replace(base, check=explicit)) == row_digest(base)


def test_the_record_fails_a_row_without_one_of_another_version_or_off_its_path(tmp_path: Path) -> None:
    rows = [row("ok", "a"), row("missing", "b"), row("changed", "c"), row("off", "d")]
    record = {
        "ok": record_entry(rows[0], "line 3"),
        "changed": record_entry(replace(rows[2], new="other"), "line 3"),
        "off": record_entry(rows[3], ""),
        "gone": record_entry(row("gone", "e"), "line 1"),
    }
    assert record_problems(rows, record) == [
        "missing: no record of its check's baseline running the mutated lines",
        "changed: its record is of another version of the row (rerun its baseline)",
        "off: the baseline of 'unit tests: variants, selection table' never ran the mutated lines",
        "gone: a record of a row the table no longer has",
    ]
    path = tmp_path / "paths.json"
    write_record(path, record, ["ok", "changed", "off"])  # "gone" is no row of the table: dropped
    assert sorted(read_record(path)) == ["changed", "off", "ok"]
    write_record(path, {"missing": record_entry(rows[1], "at import")}, ["ok", "changed", "off", "missing"])
    assert sorted(read_record(path)) == ["changed", "missing", "off", "ok"]  # merged over what was there


def test_a_row_whose_baseline_never_ran_its_lines_is_off_its_path() -> None:
    passed = BaselineRun(Verdict("(none)", "c", Outcome.PASSES, "passes", 1.0), {"r": "", "s": "line 4 (pid 1)"})
    failed = BaselineRun(Verdict("(none)", "c", Outcome.FAILS_UNMUTATED, "boom", 1.0), {"r": ""})
    caught = Verdict("r", "c", Outcome.CAUGHT, "the reason", 1.0)
    assert on_its_path(caught, passed).outcome is Outcome.OFF_PATH
    assert on_its_path(replace(caught, mutation="s"), passed) == replace(caught, mutation="s", ran="line 4 (pid 1)")
    assert on_its_path(caught, failed).outcome is Outcome.CAUGHT  # the failed baseline fails the run itself
    stale = Verdict("r", "c", Outcome.STALE, "gone", 0.0)
    assert on_its_path(stale, passed).outcome is Outcome.STALE
    assert not Outcome.OFF_PATH.ok


def test_baselines_group_the_rows_of_each_check_in_table_order() -> None:
    a, b, c = row("a", "x", check=EXPORT), row("b", "y"), row("c", "z", check=EXPORT)
    assert baselines_of([a, b, c]) == [Baseline(EXPORT, (a, c)), Baseline(UNITS, (b,))]
    with pytest.raises(MutationError, match="one kind of copy"):
        baselines_of([row("p", "x", check=UNITS), replace(row("q", "y", check=UNITS), target=Target.POLICY)])


def test_a_row_whose_text_moved_or_whose_package_is_missing_does_not_apply(tmp_path: Path) -> None:
    (tmp_path / "module.py").write_text(MODULE, encoding="utf-8")
    rows = [row("once", "y = x + 1"), row("gone", "z = 2"), row("twice", "return"), row("nofile", "a", path="no.py")]
    problems = text_problems([*rows, replace(row("peft", "a"), target=Target.PEFT)], {Target.TREE: tmp_path})
    assert problems == [
        f"gone: its text is in {tmp_path / 'module.py'} 0 times, expected once",
        f"twice: its text is in {tmp_path / 'module.py'} {MODULE.count('return')} times, expected once",
        f"nofile: {tmp_path / 'no.py'} does not exist",
        "peft: peft is not installed here (its rows need its series)",
    ]


def test_a_check_that_selects_nothing_today_is_named() -> None:
    named = row("unit", "x", check=UNITS)
    unit = replace(named, expects="FAILED \\S*::test_no_such_test")
    tree = row("tree", "x", check=in_tree("test_renamed_since"))
    fault = row("fault", "x", check=Check("bad input: gone, x2", fault="a case nobody has"))
    files = row("files", "x", check=Check("unit tests: gone", unit_tests=("test_gone.py",)))
    shape = row("shape", "x", check=Check("real width: gone", real_width=RealWidth("llama-9000", 2, ways=("DCP",))))
    way = row("way", "x", check=Check("real width: way", real_width=RealWidth("mixtral-8x7b", 2, ways=("EPMeta",))))
    step = row("step", "x", check=Check("real width: step", real_width=RealWidth("mixtral-8x7b", 2, step_case="x")))
    checked = [named, unit, tree, fault, files, shape, way, step]
    problems = selection_problems(checked, {"test_an_in_tree_test"}, UNIT_TESTS)
    assert problems == [
        "unit: its expected reason names ['test_no_such_test'], which ['test_variants.py', "
        "'test_selection_table.py'] do not define",
        "tree: no in-tree test is named 'test_renamed_since' (in tests/deepspeed, tests/distributed, tests/utils)",
        "fault: no bad-input case is named 'a case nobody has'",
        f"files: no unit test file {[str(UNIT_TESTS / 'test_gone.py')]}",
        "shape: no published shape 'llama-9000'",
        f"way: unknown way 'EPMeta'; accepted: {', '.join(accepted_ways())}",
        "step: no step case 'x'",
    ]


def test_every_check_of_the_table_but_the_in_tree_ones_selects_what_exists_today() -> None:
    """The in-tree tests need a patched checkout: `--check-table` checks them in `tox -e patches`."""
    in_tree_tests = {m.check.in_tree for m in ALL_ROWS if m.check.in_tree is not None}
    assert selection_problems(ALL_ROWS, in_tree_tests, UNIT_TESTS) == []
