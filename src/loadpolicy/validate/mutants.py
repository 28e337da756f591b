"""`loadpolicy dev mutants`: break one behaviour at a time and show which check catches it.

Each mutation replaces one exact piece of text, in a copy of the patched tree's `src` or of our `loadpolicy` package,
and runs the smallest part of the validation that must fail because of it (a matrix launch, a parity case, a bad-input
case, or the unit tests). Every check first runs on the unmutated code, where it must pass. A mutation is caught only
when its check fails for the reason the mutation names (`expects`, a pattern its failure must contain): a timeout, a
crash or another judge's complaint is "wrong reason". A mutation whose text is no longer found, a check that fails
unmutated, a wrong reason or a mutation nobody catches fails the command.
"""

from __future__ import annotations

import argparse
import enum
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.errors import CommandError
from loadpolicy.faults.run import build_fault_checkpoints
from loadpolicy.harness.launch import Tree, add_launch_arguments
from loadpolicy.matrix.run import prepare_matrix
from loadpolicy.validate.checks import OUR_PACKAGE, Setup, Target, installed_package
from loadpolicy.validate.mutation import Mutation
from loadpolicy.validate.mutations import MUTATIONS


class Outcome(enum.StrEnum):
    PASSES = "passes"  # a check on unmutated code: it must
    FAILS_UNMUTATED = "FAILS unmutated"
    CAUGHT = "caught"  # failed for the reason the mutation names
    WRONG_REASON = "NOT CAUGHT, wrong reason"  # failed, but not with what the mutation expects (a timeout, a crash)
    NOT_CAUGHT = "NOT CAUGHT"  # the check passed on mutated code
    STALE = "NOT APPLIED"  # the text to mutate is gone

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


def judge(passed: bool, detail: str, expects: str) -> Outcome:
    """A mutated check's outcome: caught only when it failed with what the mutation expects."""
    if passed:
        return Outcome.NOT_CAUGHT
    return Outcome.CAUGHT if re.search(expects, detail) else Outcome.WRONG_REASON


def excerpt(detail: str, expects: str | None, width: int = 160) -> str:
    """The part of a failure that shows why: around the expected match, else its beginning."""
    match = re.search(expects, detail) if expects else None
    start = max(0, match.start() - width // 3) if match else 0
    return " ".join(detail[start : start + width].split()).replace("|", "/")


def mutated_copy(mutation: Mutation | None, target: Target, setup: Setup, dest: Path) -> Path:
    """A copy of the code `target` names, with `mutation` applied (None: unmutated); returns what `Check` runs on."""
    shutil.rmtree(dest, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    if target is Target.TREE:
        shutil.copytree(setup.trees[Tree.PATCHED] / "src", dest / "src", ignore=skip)
        root = dest / "src" / "transformers"
    elif target in (Target.PEFT, Target.DEEPSPEED):
        shutil.copytree(setup.trees[Tree.PATCHED] / "src", dest / "src", ignore=skip)
        if (installed := installed_package(target)) is None:
            raise MutationError(f"a {target} mutation needs {target} installed (tox -e mutants installs its series)")
        root = dest / "src" / target.value
        shutil.copytree(installed, root, ignore=skip)
    else:
        shutil.copytree(OUR_PACKAGE, dest / "loadpolicy", ignore=skip)
        root = dest / "loadpolicy"
    if mutation is not None:
        path = root / mutation.path
        text = path.read_text(encoding="utf-8")
        if (found := text.count(mutation.old)) != 1:
            raise MutationError(f"{mutation.name}: the text to mutate is in {path} {found} times, expected once")
        path.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")
    return dest


class MutationError(CommandError):
    """A mutation no longer applies: the code it targets changed."""


def _baselines(setup: Setup, out: Path, selected: list[Mutation]) -> list[Verdict]:
    """Every check on unmutated code: it must pass there, or catching a mutation proves nothing."""
    verdicts = []
    checks = {m.check.label: (m.check, m.target) for m in selected}
    for index, (label, (check, target)) in enumerate(checks.items()):
        start = time.monotonic()
        code = mutated_copy(None, target, setup, out / "code" / f"baseline{index}")
        passed, detail = check.passes(code, setup, out / "runs" / f"baseline{index}")
        outcome = Outcome.PASSES if passed else Outcome.FAILS_UNMUTATED
        verdicts.append(Verdict("(none)", label, outcome, detail, time.monotonic() - start))
        why = "" if passed else f": {excerpt(detail, None)}"
        print(f"{'ok ' if passed else '!! '}baseline | {label}: {outcome}{why}", flush=True)
    return verdicts


def _mutate(mutation: Mutation, setup: Setup, out: Path) -> Verdict:
    start = time.monotonic()
    try:
        code = mutated_copy(mutation, mutation.target, setup, out / "code" / mutation.name)
    except MutationError as error:
        return Verdict(mutation.name, mutation.check.label, Outcome.STALE, str(error), 0.0)
    passed, detail = mutation.check.passes(code, setup, out / "runs" / mutation.name)
    shutil.rmtree(code, ignore_errors=True)
    outcome = judge(passed, detail, mutation.expects)
    return Verdict(mutation.name, mutation.check.label, outcome, detail, time.monotonic() - start)


def render(baselines: list[Verdict], verdicts: list[Verdict]) -> str:
    lines = [
        "| mutation | breaks | caught by | expects | result | time |",
        "|---|---|---|---|---|---|",
    ]
    by_name = {m.name: m for m in MUTATIONS}
    for v in verdicts:
        mutation = by_name[v.mutation]
        why = excerpt(v.detail, mutation.expects)
        expects = mutation.expects.replace("|", "/")
        row = (
            f"| `{v.mutation}` | {mutation.breaks} | {v.check} | `{expects}` | {v.outcome}: {why} | {v.seconds:.1f}s |"
        )
        lines.append(row)
    lines += ["", "| check, unmutated | result | time |", "|---|---|---|"]
    lines += [
        f"| {b.check} | {b.outcome} {'' if b.outcome.ok else excerpt(b.detail, None)} | {b.seconds:.1f}s |"
        for b in baselines
    ]
    return "\n".join(lines)


def mutants(out: Path, patches: Path, cache: Path, tests: Path, timeout: float, only: list[str]) -> int:
    started = time.monotonic()
    selected = [m for m in MUTATIONS if not only or m.name in only]
    unknown = sorted(set(only) - {m.name for m in MUTATIONS})
    if unknown:
        raise MutationError(f"unknown mutations {unknown}; accepted: {[m.name for m in MUTATIONS]}")
    trees, checkpoints = prepare_matrix(out, patches, cache, timeout)
    setup = Setup(trees, checkpoints, build_fault_checkpoints(checkpoints), tests.resolve(), timeout)
    baselines = _baselines(setup, out, selected)
    verdicts = []
    for index, mutation in enumerate(selected, start=1):
        verdict = _mutate(mutation, setup, out)
        verdicts.append(verdict)
        where = f"{'ok ' if verdict.outcome.ok else '!! '}[{index}/{len(selected)}] {mutation.name} -> {verdict.check}"
        print(
            f"{where}: {verdict.outcome}: {excerpt(verdict.detail, mutation.expects)} ({verdict.seconds:.1f}s)",
            flush=True,
        )
    table = render(baselines, verdicts)
    (out / "mutants.md").write_text(table + "\n", encoding="utf-8")
    details = {
        v.mutation if v.mutation != "(none)" else f"baseline: {v.check}": v.detail for v in baselines + verdicts
    }
    (out / "mutants-details.json").write_text(json.dumps(details, indent=1) + "\n", encoding="utf-8")
    print(table)
    failed = [v for v in baselines + verdicts if not v.outcome.ok]
    caught = sum(v.outcome is Outcome.CAUGHT for v in verdicts)
    elapsed = time.monotonic() - started
    print(f"\n{len(verdicts)} mutations, {caught} caught as named, {len(failed)} problems, {elapsed:.0f}s")
    print(f"table: {out / 'mutants.md'}; every failure in full: {out / 'mutants-details.json'}", file=sys.stderr)
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("mutants", help="break one behaviour at a time and show which check catches it")
    parser.add_argument("names", nargs="*", help=f"mutations to run (default: all of {[m.name for m in MUTATIONS]})")
    parser.add_argument("--out", type=Path, default=Path("build/mutants"), help="work directory and table")
    add_launch_arguments(parser, timeout=180.0)
    parser.add_argument("--tests", type=Path, default=Path("tests/unit"), help="where the unit tests are")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    if mutants(args.out, args.patches, args.cache, args.tests, args.timeout, args.names):
        raise MutationError(
            "a check failed on unmutated code, or a mutation was not caught for the reason it names: see the table"
        )
    return "every mutation was caught for the reason it names, and every check passes on unmutated code"
