"""Running the mutation table: break one behaviour at a time and show which check catches it.

Each mutation replaces one exact piece of text, in a copy of the patched tree's `src` or of our `loadpolicy` package,
and runs the smallest part of the validation that must fail because of it (a matrix launch, a parity case, a
bad-input case, the unit tests or the patched tree's own tests). Every check first runs on the unmutated code, where it
must pass, with a probe in each module its rows mutate (`paths`): a row whose lines its check's baseline never ran is
"NOT ON ITS CHECK'S PATH", whatever the mutated run did. A mutation is caught only when its check fails for the reason
the mutation names (`expects`, a pattern its failure must contain): a timeout, a crash or another judge's complaint is
"wrong reason". A mutation whose text is no longer found, a check that fails unmutated, a wrong reason, a row off its
check's path or a mutation nobody catches fails the command. Baselines and mutations run `jobs` at a time
(`harness/pool.py`), each in a folder of its own; the verdicts do not depend on the order they end in.
"""

from __future__ import annotations

import enum
import json
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from loadpolicy.errors import CommandError
from loadpolicy_lab.faults.run import build_fault_checkpoints
from loadpolicy_lab.harness.launch import Tree, stop_every_launch
from loadpolicy_lab.harness.pool import run_all
from loadpolicy_lab.matrix.run import prepare_matrix
from loadpolicy_lab.validate.mutants.checks import OUR_PACKAGE, Check, Setup, Target, installed_package
from loadpolicy_lab.validate.mutants.paths import install_probes, record_entry, where_it_ran, write_record
from loadpolicy_lab.validate.mutants.real_width import prepare_real_width
from loadpolicy_lab.validate.mutants.row import Mutation
from loadpolicy_lab.validate.mutants.table import ALL_ROWS, MUTATIONS, REAL_WIDTH_MUTATIONS


class Outcome(enum.StrEnum):
    PASSES = "passes"  # a check on unmutated code: it must
    FAILS_UNMUTATED = "FAILS unmutated"
    CAUGHT = "caught"  # failed for the reason the mutation names
    WRONG_REASON = "NOT CAUGHT, wrong reason"  # failed, but not with what the mutation expects (a timeout, a crash)
    NOT_CAUGHT = "NOT CAUGHT"  # the check passed on mutated code
    STALE = "NOT APPLIED"  # the text to mutate is gone
    OFF_PATH = "NOT ON ITS CHECK'S PATH"  # the check's baseline never ran the mutated lines

    @property
    def ok(self) -> bool:
        return self in (Outcome.PASSES, Outcome.CAUGHT)


@dataclass(frozen=True, slots=True)
class Verdict:
    mutation: str
    check: str
    outcome: Outcome
    detail: str
    seconds: float
    ran: str = ""  # where the check's baseline ran the mutated lines (`paths.where_it_ran`), "" where it did not


@dataclass(frozen=True, slots=True)
class Baseline:
    """One check on unmutated code, probed for the rows that name it."""

    check: Check
    rows: tuple[Mutation, ...]

    @property
    def targets(self) -> frozenset[Target]:
        return frozenset(m.target for m in self.rows)


@dataclass(frozen=True, slots=True)
class BaselineRun:
    verdict: Verdict
    ran: dict[str, str] = field(default_factory=dict)  # row -> where its lines ran ("" where they did not)


def judge(passed: bool, detail: str, expects: str) -> Outcome:
    """A mutated check's outcome: caught only when it failed with what the mutation expects."""
    if passed:
        return Outcome.NOT_CAUGHT
    return Outcome.CAUGHT if re.search(expects, detail) else Outcome.WRONG_REASON


def on_its_path(verdict: Verdict, baseline: BaselineRun) -> Verdict:
    """`verdict` with where its check's baseline ran the mutated lines; off the path where it never did (a baseline
    that failed says nothing about the path, and fails the run itself)."""
    ran = baseline.ran.get(verdict.mutation, "")
    outcome = verdict.outcome
    if not ran and outcome is not Outcome.STALE and baseline.verdict.outcome is Outcome.PASSES:
        outcome = Outcome.OFF_PATH
    return Verdict(verdict.mutation, verdict.check, outcome, verdict.detail, verdict.seconds, ran)


def excerpt(detail: str, expects: str | None, width: int = 160) -> str:
    """The part of a failure that shows why: around the expected match, else its beginning."""
    match = re.search(expects, detail) if expects else None
    start = max(0, match.start() - width // 3) if match else 0
    return " ".join(detail[start : start + width].split()).replace("|", "/")


class MutationError(CommandError):
    """A mutation no longer applies: the code it targets changed."""


def baselines_of(selected: Iterable[Mutation]) -> list[Baseline]:
    """One baseline per check the rows name, in the order the table first names them."""
    rows: dict[str, list[Mutation]] = {}
    checks: dict[str, Check] = {}
    for mutation in selected:
        rows.setdefault(mutation.check.label, []).append(mutation)
        checks[mutation.check.label] = mutation.check
    for label, named in rows.items():
        if Target.POLICY in {m.target for m in named} and len({m.target for m in named}) > 1:
            raise MutationError(f"{label!r} checks both our package and the trees; a check runs on one kind of copy")
    return [Baseline(checks[label], tuple(named)) for label, named in rows.items()]


def code_copy(targets: frozenset[Target], setup: Setup, dest: Path) -> tuple[dict[Target, Path], Path]:
    """A copy of the code `targets` name at `dest`, what a `Check` runs on: per target, the folder its rows' paths are
    relative to, and the folder of the copy every process the check starts imports from."""
    shutil.rmtree(dest, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    if Target.POLICY in targets:
        shutil.copytree(OUR_PACKAGE, dest / "loadpolicy", ignore=skip)
        return {Target.POLICY: dest / "loadpolicy"}, dest
    shutil.copytree(setup.trees[Tree.PATCHED] / "src", dest / "src", ignore=skip)
    roots = {Target.TREE: dest / "src" / "transformers"}
    for target in sorted(targets & {Target.PEFT, Target.DEEPSPEED}):
        if (installed := installed_package(target)) is None:
            raise MutationError(f"a {target} mutation needs {target} installed (tox -e mutants installs its series)")
        roots[target] = dest / "src" / target.value
        shutil.copytree(installed, roots[target], ignore=skip)
    return roots, dest / "src"


def mutated_copy(mutation: Mutation, setup: Setup, dest: Path) -> Path:
    """A copy of the code `mutation` targets, with it applied; returns what its `Check` runs on."""
    roots, _ = code_copy(frozenset({mutation.target}), setup, dest)
    path = roots[mutation.target] / mutation.path
    text = path.read_text(encoding="utf-8")
    if (found := text.count(mutation.old)) != 1:
        raise MutationError(f"{mutation.name}: the text to mutate is in {path} {found} times, expected once")
    path.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")
    return dest


def run_baseline(baseline: Baseline, index: int, setup: Setup, out: Path) -> BaselineRun:
    """A check on unmutated code, which must pass there (or catching a mutation proves nothing), and where it ran the
    lines each of its rows mutates."""
    start = time.monotonic()
    code, probes = out / "code" / f"baseline{index}", out / "probes" / f"baseline{index}"
    shutil.rmtree(probes, ignore_errors=True)
    roots, import_root = code_copy(baseline.targets, setup, code)
    for target, root in roots.items():
        # a row whose text is gone is reported by its own run (NOT APPLIED); its probe would not know where to look
        rows = [m for m in baseline.rows if m.target is target and _found_once(root / m.path, m.old)]
        install_probes(root, import_root, rows, probes)
    passed, detail = baseline.check.passes(code, setup, out / "runs" / f"baseline{index}")
    shutil.rmtree(code, ignore_errors=True)
    outcome = Outcome.PASSES if passed else Outcome.FAILS_UNMUTATED
    verdict = Verdict("(none)", baseline.check.label, outcome, detail, time.monotonic() - start)
    return BaselineRun(verdict, {m.name: where_it_ran(probes, m.name) for m in baseline.rows})


def _found_once(path: Path, old: str) -> bool:
    return path.exists() and path.read_text(encoding="utf-8").count(old) == 1


def run_mutation(mutation: Mutation, setup: Setup, out: Path) -> Verdict:
    start = time.monotonic()
    try:
        code = mutated_copy(mutation, setup, out / "code" / mutation.name)
    except MutationError as error:
        return Verdict(mutation.name, mutation.check.label, Outcome.STALE, str(error), 0.0)
    passed, detail = mutation.check.passes(code, setup, out / "runs" / mutation.name)
    shutil.rmtree(code, ignore_errors=True)
    outcome = judge(passed, detail, mutation.expects)
    return Verdict(mutation.name, mutation.check.label, outcome, detail, time.monotonic() - start)


def render(baselines: list[Verdict], verdicts: list[Verdict]) -> str:
    lines = [
        "| mutation | breaks | caught by | mutated line on its baseline | expects | result | time |",
        "|---|---|---|---|---|---|---|",
    ]
    by_name = {m.name: m for m in ALL_ROWS}
    for v in verdicts:
        mutation = by_name[v.mutation]
        why = excerpt(v.detail, mutation.expects)
        expects = mutation.expects.replace("|", "/")
        ran = v.ran.split(" (pid")[0] or "never ran"
        lines.append(
            f"| `{v.mutation}` | {mutation.breaks} | {v.check} | {ran} | `{expects}` | {v.outcome}: {why} | "
            f"{v.seconds:.1f}s |"
        )
    lines += ["", "| check, unmutated | result | time |", "|---|---|---|"]
    lines += [
        f"| {b.check} | {b.outcome} {'' if b.outcome.ok else excerpt(b.detail, None)} | {b.seconds:.1f}s |"
        for b in baselines
    ]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Options:
    out: Path
    patches: Path
    cache: Path
    tests: Path
    timeout: float
    only: list[str]
    jobs: int = 1  # baselines and mutations side by side
    baselines_only: bool = False  # the probed baselines alone: where each check runs its rows' lines
    record: Path | None = None  # where to keep the rows' paths (docs/results/mutation-paths.json)
    real_widths: bool = False  # the rows at a published width instead of the table's (`rows_widths`)
    widths_checkpoints: Path = Path("build/widths/checkpoints")


def selected_rows(only: list[str], real_widths: bool = False) -> list[Mutation]:
    """The rows named (any row), else the table's, or with `real_widths` those at a published width."""
    unknown = sorted(set(only) - {m.name for m in ALL_ROWS})
    if unknown:
        raise MutationError(f"unknown mutations {unknown}; accepted: {[m.name for m in ALL_ROWS]}")
    if only:
        return [m for m in ALL_ROWS if m.name in only]
    return list(REAL_WIDTH_MUTATIONS if real_widths else MUTATIONS)


def mutants(options: Options) -> int:
    """Run the selected rows' baselines, then (unless `baselines_only`) their mutations; write the table, every
    failure in full and the rows' paths; 1 where anything is not as it must be."""
    started = time.monotonic()
    selected = selected_rows(options.only, options.real_widths)
    baselines = baselines_of(selected)
    out = options.out
    trees, checkpoints = prepare_matrix(out, options.patches, options.cache, options.timeout)
    variants, widths = build_fault_checkpoints(checkpoints), options.widths_checkpoints.resolve()
    setup = Setup(trees, checkpoints, variants, options.tests.resolve(), options.timeout, widths_checkpoints=widths)
    for check in {b.check.real_width for b in baselines} - {None}:
        assert check is not None
        prepare_real_width(check, trees[Tree.STOCK], widths)
    mutations = [] if options.baselines_only else selected
    jobs: list[Callable[[], BaselineRun | Verdict]] = [
        *(_bound(run_baseline, b, i, setup, out) for i, b in enumerate(baselines)),
        *(_bound(run_mutation, m, setup, out) for m in mutations),
    ]
    results = run_all(jobs, options.jobs, lambda index, result: print(_line(result), flush=True), stop_every_launch)
    runs = [r for r in results if isinstance(r, BaselineRun)]
    of_check = {b.check.label: run for b, run in zip(baselines, runs, strict=True)}
    verdicts = [on_its_path(v, of_check[v.check]) for v in results if isinstance(v, Verdict)]
    problems = _report(out, [r.verdict for r in runs], verdicts)
    entries = {
        m.name: record_entry(m, of_check[m.check.label].ran.get(m.name, ""))
        for m in selected
        if of_check[m.check.label].verdict.outcome is Outcome.PASSES
    }
    for path in filter(None, (out / "mutation-paths.json", options.record)):
        write_record(path, entries, [m.name for m in ALL_ROWS])
    off_path = [m.name for m in selected if m.name not in entries or not entries[m.name]["ran"]]
    if off_path:
        print(f"rows whose check's baseline did not run their lines (or failed): {off_path}")
    caught = sum(v.outcome is Outcome.CAUGHT for v in verdicts)
    elapsed = time.monotonic() - started
    print(f"\n{len(verdicts)} mutations, {caught} caught as named, {problems} problems, {elapsed:.0f}s")
    print(f"table: {out / 'mutants.md'}; every failure in full: {out / 'mutants-details.json'}", file=sys.stderr)
    return 1 if problems or off_path else 0


def _bound(function: Callable[..., BaselineRun | Verdict], *args: object) -> Callable[[], BaselineRun | Verdict]:
    return lambda: function(*args)


def _line(result: BaselineRun | Verdict) -> str:
    """How one finished run is reported as it ends."""
    if isinstance(result, BaselineRun):
        v = result.verdict
        off = sorted(name for name, ran in result.ran.items() if not ran)
        why = "" if v.outcome.ok else f": {excerpt(v.detail, None)}"
        path = f"; never ran the lines of {off}" if off and v.outcome.ok else ""
        return f"{'ok ' if v.outcome.ok and not off else '!! '}baseline | {v.check}: {v.outcome}{why}{path}"
    expects = next(m.expects for m in ALL_ROWS if m.name == result.mutation)
    where = f"{'ok ' if result.outcome.ok else '!! '}{result.mutation} -> {result.check}"
    return f"{where}: {result.outcome}: {excerpt(result.detail, expects)} ({result.seconds:.1f}s)"


def _report(out: Path, baselines: list[Verdict], verdicts: list[Verdict]) -> int:
    """Write and print the table and every failure in full; the number of problems."""
    table = render(baselines, verdicts)
    (out / "mutants.md").write_text(table + "\n", encoding="utf-8")
    details = {
        v.mutation if v.mutation != "(none)" else f"baseline: {v.check}": v.detail for v in baselines + verdicts
    }
    (out / "mutants-details.json").write_text(json.dumps(details, indent=1) + "\n", encoding="utf-8")
    print(table)
    return sum(not v.outcome.ok for v in baselines + verdicts)
