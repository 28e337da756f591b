"""Whether each mutated line is on the way of the check that names it: the probe of a baseline, and its record.

A check that never runs the code a row mutates passes mutated as it passes unmutated, for no reason the table can
show (`save-repeats-own-shard` once named a parity case that had moved to partition writes). So every baseline runs
on a copy whose mutated modules each end with a call of `probe_hook.watch`, which writes a file per row whose lines
ran (`probe_hook`); `record_entries` reads them back. `docs/results/mutation-paths.json` keeps, per row, a digest of
the row (target, file, text, replacement, check) and where its lines ran; `record_problems`, which `--check-table`
runs in CI, fails a row with no record, a record of another version of the row, or a record of lines that never ran.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadpolicy_lab.validate.mutants.row import Mutation


# the module `probe_hook` becomes in a copy: importable beside the packages there (on every launch's path)
PROBE_MODULE = "_loadpolicy_probe"
PROBE_SOURCE = Path(__file__).with_name("probe_hook.py")
RECORD = Path("docs/results/mutation-paths.json")


@dataclass(frozen=True, slots=True)
class Span:
    """Where the text a row mutates runs: `lines` of function bodies (seen when they run), and whether part of it is
    module or class level (`at_import`: it ran once the module is imported)."""

    lines: frozenset[int]
    at_import: bool


_Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def _body_start(node: _Function) -> int:
    return node.body.lineno if isinstance(node, ast.Lambda) else node.body[0].lineno


def span_of(source: str, old: str) -> Span:
    """The lines of `old` (found once in `source`) whose running shows the mutated code ran. A line in a function's
    body is itself; a line of a decorator or of a `def` (run where the function is defined) stands for the function's
    body (the function running); any other line is module or class level."""
    start = source.index(old)
    first = source.count("\n", 0, start) + 1
    last = first + old.rstrip("\n").count("\n")
    nodes = list(ast.walk(ast.parse(source)))
    functions = [node for node in nodes if isinstance(node, _Function)]
    # module and class level code: a simple statement, or the head of a class (blank and comment lines are neither)
    top = [
        (node.lineno, node.body[0].lineno - 1 if isinstance(node, ast.ClassDef) else node.end_lineno or node.lineno)
        for node in nodes
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    lines: set[int] = set()
    at_import = False
    for line in range(first, last + 1):
        if any(_body_start(f) <= line <= (f.end_lineno or f.lineno) for f in functions):
            lines.add(line)
            continue
        heads = [
            f
            for f in functions
            if not isinstance(f, ast.Lambda)
            and min([f.lineno, *(d.lineno for d in f.decorator_list)]) <= line < _body_start(f)
        ]
        if heads:
            head = max(heads, key=lambda f: f.lineno)  # the innermost
            lines.update(range(_body_start(head), (head.end_lineno or head.lineno) + 1))
        elif any(begin <= line <= end for begin, end in top):
            at_import = True
    return Span(frozenset(lines), at_import)


def probe_call(rows: dict[str, Span], folder: Path) -> str:
    """The lines appended to a module of the copy so that every process importing it records `rows` in `folder`."""
    watched = {name: sorted(span.lines) for name, span in rows.items() if span.lines}
    at_import = sorted(name for name, span in rows.items() if span.at_import)
    return (
        f"\n\nimport {PROBE_MODULE}  # appended by `loadpolicy dev mutants` to the copy a baseline runs on\n"
        f"{PROBE_MODULE}.watch({watched!r}, {at_import!r}, {str(folder)!r})\n"
    )


def install_probes(package: Path, import_root: Path, rows: Iterable[Mutation], folder: Path) -> None:
    """Append to each module of `package` (a copy) that `rows` mutate the call that records them, and put the probe
    in `import_root`, the folder of the copy on the path of every process its check starts."""
    by_file: dict[Path, dict[str, Span]] = {}
    for mutation in rows:
        path = package / mutation.path
        by_file.setdefault(path, {})[mutation.name] = span_of(path.read_text(encoding="utf-8"), mutation.old)
    (import_root / f"{PROBE_MODULE}.py").write_text(PROBE_SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
    for path, spans in by_file.items():
        with path.open("a", encoding="utf-8") as module:
            module.write(probe_call(spans, folder.resolve()))


def where_it_ran(folder: Path, name: str) -> str:
    """Where the probe saw row `name` run ("line N (pid P)" or "at import (pid P)"), or "" where it never did."""
    path = folder / name
    return path.read_text(encoding="utf-8").splitlines()[0] if path.exists() else ""


def _described(value: Any) -> Any:
    """A dataclass as its fields that differ from their defaults (recursively), an enum as its value: what a digest
    reads, so that a field added with a default does not change a row."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        described = {}
        for field in dataclasses.fields(value):
            item = getattr(value, field.name)
            if field.default is dataclasses.MISSING or item != field.default:
                described[field.name] = _described(item)
        return described
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_described(item) for item in value]
    return value


def row_digest(mutation: Mutation) -> str:
    """What a row's record stands for: the code it mutates and how, and the check that runs it."""
    fields = [mutation.target.value, mutation.path, mutation.old, mutation.new, _described(mutation.check)]
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def record_entry(mutation: Mutation, ran: str) -> dict[str, str]:
    """A row's record: its digest, its check, and where its lines ran (without the process: one like another)."""
    return {"digest": row_digest(mutation), "check": mutation.check.label, "ran": ran.split(" (pid ")[0]}


def read_record(path: Path) -> dict[str, dict[str, str]]:
    if not path.exists():
        return {}
    rows: dict[str, dict[str, str]] = json.loads(path.read_text(encoding="utf-8"))["rows"]
    return rows


def write_record(path: Path, entries: dict[str, dict[str, str]], names: Iterable[str]) -> None:
    """`entries` over what `path` holds, keeping only the rows of `names` (the table's), sorted."""
    rows = {name: entry for name, entry in (read_record(path) | entries).items() if name in set(names)}
    payload = {
        "about": "per row of the mutation table: a digest of the row and where the baseline of its check ran the "
        "mutated lines (`loadpolicy dev mutants --record-paths`; checked by `loadpolicy dev mutants --check-table`)",
        "rows": dict(sorted(rows.items())),
    }
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def record_problems(
    mutations: Iterable[Mutation], record: dict[str, dict[str, str]], known: Iterable[str] | None = None
) -> list[str]:
    """Each row with no record, a record of another version of it (its code, text or check changed since), or a
    record of a baseline that never ran its lines; and each record of a row the table (`known`: by default the rows
    given) no longer has."""
    problems, names = [], set()
    for mutation in mutations:
        names.add(mutation.name)
        entry = record.get(mutation.name)
        if entry is None:
            problems.append(f"{mutation.name}: no record of its check's baseline running the mutated lines")
        elif entry.get("digest") != row_digest(mutation):
            problems.append(f"{mutation.name}: its record is of another version of the row (rerun its baseline)")
        elif not entry.get("ran"):
            problems.append(f"{mutation.name}: the baseline of {mutation.check.label!r} never ran the mutated lines")
    table = names if known is None else set(known)
    problems += [f"{name}: a record of a row the table no longer has" for name in sorted(set(record) - table)]
    return problems
