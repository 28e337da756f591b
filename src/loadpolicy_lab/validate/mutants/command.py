"""`loadpolicy dev mutants`: the command line of the mutation table (`run`) and of its fast check (`table_check`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from loadpolicy.errors import positive_int
from loadpolicy_lab.harness.launch import add_launch_arguments
from loadpolicy_lab.validate.mutants.paths import RECORD
from loadpolicy_lab.validate.mutants.run import MutationError, Options, mutants
from loadpolicy_lab.validate.mutants.table import MUTATIONS
from loadpolicy_lab.validate.mutants.table_check import TableCheckError, check_table
from loadpolicy_lab.validate.mutants.upstream_ep import ROWS as UPSTREAM_EP_ROWS
from loadpolicy_lab.validate.mutants.upstream_ep import run_upstream_ep


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("mutants", help="break one behaviour at a time and show which check catches it")
    parser.add_argument("names", nargs="*", help=f"mutations to run (default: all of {[m.name for m in MUTATIONS]})")
    parser.add_argument("--out", type=Path, default=Path("build/mutants"), help="work directory and table")
    add_launch_arguments(parser, timeout=180.0)
    parser.add_argument("--tests", type=Path, default=Path("tests/unit"), help="where the unit tests are")
    parser.add_argument(
        "--jobs", type=positive_int, default=1, help="checks run side by side (2 on this 2-core machine: ~20 min)"
    )
    parser.add_argument(
        "--baselines-only",
        action="store_true",
        help="run only the checks on unmutated code, probed: where each runs the lines its rows mutate",
    )
    parser.add_argument(
        "--record-paths",
        type=Path,
        metavar="FILE",
        help=f"keep where each baseline ran its rows' lines in FILE too (the record CI checks: {RECORD})",
    )
    parser.add_argument(
        "--real-widths",
        action="store_true",
        help="the rows at a published width instead of the table's (minutes each, checkpoints of several GiB)",
    )
    parser.add_argument(
        "--widths-checkpoints",
        type=Path,
        default=Path("build/widths/checkpoints"),
        help="where the real-width rows' checkpoints are built once (default: build/widths/checkpoints)",
    )
    parser.add_argument(
        "--check-table",
        type=Path,
        metavar="PATCHED_CHECKOUT",
        help="run nothing: check in seconds that every row applies to this checkout, every check selects a test or "
        f"case, and every row's record in {RECORD} is of the row as it is",
    )
    parser.add_argument(
        "--upstream-ep",
        action="store_true",
        help="the table of patches/upstream-ep instead, on a fresh checkout of it under --out: "
        f"{[row.name for row in UPSTREAM_EP_ROWS]}",
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    if args.upstream_ep:
        caught, table = run_upstream_ep(args.patches, args.cache, args.out, args.names, max(args.timeout, 900.0))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mutants-upstream-ep.md").write_text(table, encoding="utf-8")
        if not caught:
            raise MutationError(f"a baseline failed or a mutation was not caught:\n{table}")
        return table
    if args.check_table is not None:
        problems = check_table(args.check_table, args.tests, args.record_paths or RECORD, args.names)
        if problems:
            raise TableCheckError("the mutation table does not hold:\n  " + "\n  ".join(problems))
        return f"every row applies to {args.check_table}, selects its check's tests and is recorded on its path"
    options = Options(
        args.out,
        args.patches,
        args.cache,
        args.tests,
        args.timeout,
        args.names,
        jobs=args.jobs,
        baselines_only=args.baselines_only,
        record=args.record_paths,
        real_widths=args.real_widths,
        widths_checkpoints=args.widths_checkpoints,
    )
    if mutants(options):
        raise MutationError(
            "a check failed on unmutated code, never ran a row's lines, or a mutation was not caught for the reason "
            "it names: see the table"
        )
    if args.baselines_only:
        return "every check passes on unmutated code and runs the lines its rows mutate"
    return "every mutation was caught for the reason it names, and every check passes on unmutated code"
