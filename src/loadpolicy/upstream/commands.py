"""`loadpolicy checkout` and `loadpolicy dev series ...`: the pinned upstream tree and the patch series."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from loadpolicy.errors import positive_seconds
from loadpolicy.upstream.branch import added_test_files, find_pull_request, render_description, write_branch
from loadpolicy.upstream.build import build_wheel, install, local_version
from loadpolicy.upstream.carry import SOURCE, TRANSFORMERS_MODULE, render_transformers_module
from loadpolicy.upstream.checkout import checkout, pristine_tag
from loadpolicy.upstream.fetch import fetch_unpinned
from loadpolicy.upstream.pin import UpstreamError, read_pin
from loadpolicy.upstream.refresh import refresh
from loadpolicy.upstream.released import released_deepspeed_python
from loadpolicy.upstream.series import export_series, group_sizes, lint_series, read_series, require_clean
from loadpolicy.upstream.series_check import check_series
from loadpolicy.upstream.size_table import (
    SERIES_FOLDERS,
    read_positions,
    size_problems,
    sizes_by_pr,
    table_rows,
    with_counted_sizes,
)
from loadpolicy.upstream.stack import check_prefixes, run_series_tests, upstream_bound_series
from loadpolicy.upstream.stack_record import (
    require_current_record,
    require_tree_is_series,
    series_digest,
    write_record,
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--patches", type=Path, default=Path("patches"), help="series directory (default: patches)")
    parser.add_argument("--cache", type=Path, default=Path("build/cache"), help="sdist cache (default: build/cache)")


def add_checkout_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("checkout", help="pinned transformers sdist, verified, as git with the series")
    parser.add_argument("dest", type=Path, help="new directory for the git checkout")
    parser.add_argument("--pristine", action="store_true", help="stop after the pristine upstream commit")
    parser.add_argument("--install", action="store_true", help="pip install the patched tree here")
    parser.add_argument("--wheel", type=Path, metavar="DIR", help="build a 5.23.0+loadpolicy.<hash> wheel into DIR")
    _common(parser)
    parser.set_defaults(handler=_checkout)


def add_series_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    series = subparsers.add_parser("series", help="lint, export or refresh the patch series").add_subparsers(
        dest="series_command", required=True, metavar="ACTION"
    )
    lint = series.add_parser("lint", help="listing, headers, and (with --apply) a clean apply to the pinned tree")
    lint.add_argument("--apply", action="store_true", help="also apply the series to a fresh pristine checkout")
    lint.add_argument(
        "--require-stack-record",
        type=Path,
        metavar="FILE",
        help="also fail unless FILE records the full stack check of exactly this series (`tox -e stack` writes it)",
    )
    _common(lint)
    lint.set_defaults(handler=_lint)

    export = series.add_parser("export", help="regenerate the series from a checkout's branch, deterministically")
    export.add_argument("tree", type=Path)
    _common(export)
    export.set_defaults(handler=_export)

    _add_stack_parser(series)

    test = series.add_parser(
        "test", help="the three series linted, applied, installed and tested in order (what `tox -e patches` runs)"
    )
    test.add_argument("work", type=Path, help="where the DeepSpeed, PEFT and transformers checkouts are made afresh")
    test.add_argument("--tests", type=Path, default=Path("tests/patches"), help="this repository's tests of the tree")
    test.add_argument("--stack-record", type=Path, default=Path("patches/STACK"), help="the stack check's record")
    _common(test)
    test.set_defaults(handler=_test)

    _add_sizes_parser(series)
    _add_branch_parser(series)

    sync = series.add_parser("sync-policy", help="write the generated policy module into a checkout")
    sync.add_argument("tree", type=Path)
    sync.set_defaults(handler=_sync_policy)

    again = series.add_parser("refresh", help="rebase the series onto another release; show git range-diff")
    again.add_argument("version", help="the transformers release to try, e.g. 5.24.0")
    again.add_argument("dest", type=Path, help="new directory for the checkout")
    again.add_argument("--test", action="store_true", help="then run the series' tests on the rebased tree")
    again.add_argument("--timeout", type=positive_seconds, default=1800.0, help="bound on those tests, in seconds")
    _common(again)
    again.set_defaults(handler=_refresh)


def _test(args: argparse.Namespace) -> str:
    return check_series(args.work, args.patches, args.cache, args.tests, args.stack_record)


def _checkout(args: argparse.Namespace) -> str:
    pin = checkout(args.dest, args.patches, args.cache, apply=not args.pristine)
    lines = [f"{args.dest}: {pin.name} {pin.version} (sha256 verified), tag {pristine_tag(pin)}"]
    if not args.pristine:
        lines.append(f"applied {len(read_series(args.patches).names)} patches on branch loadpolicy")
    if args.install:
        # transformers carries the series in its version; the DeepSpeed and PEFT trees keep theirs
        patched = pin.name == "transformers" and not args.pristine
        version = local_version(pin, read_series(args.patches)) if patched else None
        install(args.dest, pin.name, version)
        lines.append(f"installed the patched tree as {pin.name} {version or pin.version}")
        if version is not None:
            lines.append(f"check: python -c 'import transformers; print(transformers.__version__)' prints {version}")
    if args.wheel is not None:
        lines.append(f"built {build_wheel(args.dest, pin, read_series(args.patches), args.wheel)}")
    return "\n".join(lines)


def _lint(args: argparse.Namespace) -> str:
    series = read_series(args.patches)
    require_clean(lint_series(series))
    said = [f"{len(series.names)} patches: listed once each, headers present"]
    if args.require_stack_record is not None:
        said.append(
            f"the full stack check is recorded for them ({require_current_record(args.require_stack_record, series)})"
        )
    if args.apply:
        with tempfile.TemporaryDirectory() as tmp:
            checkout(Path(tmp) / "tree", args.patches, args.cache)
        said.append("apply cleanly")
    return "; ".join(said)


def _export(args: argparse.Namespace) -> str:
    pin = read_pin(args.patches / "UPSTREAM")
    names = export_series(args.tree, pristine_tag(pin), args.patches)
    return f"wrote {len(names)} patches and series to {args.patches}"


def _stack(args: argparse.Namespace) -> str:
    if args.write_record is not None and args.standalone_tests_only:
        raise UpstreamError("--write-record records the full check: leave out --standalone-tests-only")
    pin, series, tree = read_pin(args.patches / "UPSTREAM"), read_series(args.patches), args.tree.resolve()
    digest = series_digest(series)
    if args.write_record is not None:
        require_tree_is_series(tree, pristine_tag(pin), series)
    released = None
    if args.released_deepspeed:
        deepspeed = read_pin(args.patches / "deepspeed" / "UPSTREAM")
        python = released_deepspeed_python(tree.parent / f"{tree.name}-released", deepspeed, args.cache)
        released = (python, f"released DeepSpeed {deepspeed.version}")
    every, alone_only = args.every_earlier_test, args.standalone_tests_only
    results = check_prefixes(tree, series, pristine_tag(pin), args.timeout, alone_only, released, every)
    lines = [r.describe() for r in results]
    for nested in upstream_bound_series(args.patches, pin):
        # a series of its own on the pristine sources: a PR that needs nothing runs against released DeepSpeed too
        nested_tree = tree.parent / f"{tree.name}-{nested.name}"
        checkout(nested_tree, nested, args.cache)
        nested_results = check_prefixes(
            nested_tree, read_series(nested), pristine_tag(pin), args.timeout, alone_only, released, every
        )
        lines += [f"patches/{nested.name} {r.describe()}" for r in nested_results]
    if args.write_record is None:
        return "\n".join(lines)
    write_record(args.write_record, series, digest, lines)
    return "\n".join([*lines, f"wrote {args.write_record} (series sha256 {digest})"])


def _add_sizes_parser(series: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sizes = series.add_parser("sizes", help="each PR's patches and the lines it adds to src/ and tests/, as a table")
    sizes.add_argument(
        "--docs",
        type=Path,
        metavar="DIR",
        help="write the counts into DIR/README.md's PR tables (docs/upstream), then name what still differs",
    )
    _common(sizes)
    sizes.set_defaults(handler=_sizes)


def _add_stack_parser(series: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stack = series.add_parser("stack", help="each PR's prefix of the series on its own: imports, its own tests")
    stack.add_argument("tree", type=Path, help="a checkout with the whole series applied (`loadpolicy checkout`)")
    stack.add_argument(
        "--timeout", type=positive_seconds, default=1200.0, help="bound on each prefix's tests, in seconds"
    )
    stack.add_argument(
        "--standalone-tests-only",
        action="store_true",
        help="run only the tests of the PRs checked alone (every prefix still imports): the quick part, by hand",
    )
    stack.add_argument(
        "--write-record", type=Path, metavar="FILE", help="after the full check, record it for these patches in FILE"
    )
    stack.add_argument(
        "--every-earlier-test",
        action="store_true",
        help="at each PR's place in the series, also run every earlier PR's tests (as a maintainer's CI would)",
    )
    stack.add_argument(
        "--released-deepspeed",
        action="store_true",
        help="import and test the PRs that need nothing against the DeepSpeed release the DeepSpeed series pins",
    )
    _common(stack)
    stack.set_defaults(handler=_stack)


def _add_branch_parser(series: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    branch = series.add_parser("branch", help="one PR as its upstream receives it: a branch and its description")
    branch.add_argument("name", help="the PR's stable name (docs/upstream/names.md)")
    branch.add_argument("tree", type=Path, help="a checkout with the PR's series applied (`loadpolicy checkout`)")
    branch.add_argument("--docs", type=Path, default=Path("docs/upstream"), help="the PR descriptions' folder")
    branch.add_argument("--out", type=Path, default=Path("build/upstream"), help="where NAME.md is written")
    _common(branch)
    branch.set_defaults(handler=_branch)


def _branch(args: argparse.Namespace) -> str:
    pr = find_pull_request(args.name, args.docs, args.patches)
    folder = args.patches / SERIES_FOLDERS[pr.series]
    base = pristine_tag(read_pin(folder / "UPSTREAM"))
    branch, subjects = write_branch(pr, args.tree.resolve(), base)
    tests = added_test_files(args.tree.resolve(), branch, pr)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{pr.name.replace(':', '-')}.md"
    path.write_text(render_description(pr, branch, subjects, tests, base), encoding="utf-8")
    return f"{branch} in {args.tree} ({len(subjects)} commits on {base}); its description: {path}"


def _sizes(args: argparse.Namespace) -> str:
    if args.docs is not None:
        return _write_sizes(args.docs, args.patches)
    lines = ["| group | patches | src +/- | tests + | applies alone |", "|---|---:|---:|---:|---|"]
    lines += [
        f"| {g.label} | {g.patches} | +{g.source_added} / -{g.source_removed} | +{g.tests_added} | "
        f"{'yes' if g.alone else 'on the PRs before it'} |"
        for g in group_sizes(read_series(args.patches))
    ]
    return "\n".join(lines)


def _write_sizes(docs: Path, patches: Path) -> str:
    page = docs / "README.md"
    where, sizes = read_positions(docs / "names.md"), sizes_by_pr(patches)
    text = page.read_text(encoding="utf-8")
    counted = with_counted_sizes(text, where, sizes)
    if counted != text:
        page.write_text(counted, encoding="utf-8")
    if problems := size_problems(table_rows(counted), where, sizes):
        raise UpstreamError(f"{page}: rows the counts cannot fix:\n" + "\n".join(f"  {p}" for p in problems))
    return f"{page}: every PR table row has its patches' sizes" + (" (rewritten)" if counted != text else "")


def _sync_policy(args: argparse.Namespace) -> str:
    target = args.tree / TRANSFORMERS_MODULE
    target.write_text(render_transformers_module(SOURCE.read_text(encoding="utf-8")), encoding="utf-8")
    return f"wrote {target}; amend the fork-only patch that carries it, then `loadpolicy dev series export`"


def _refresh(args: argparse.Namespace) -> str:
    pin = read_pin(args.patches / "UPSTREAM")
    checkout(args.dest, args.patches, args.cache)
    target = fetch_unpinned(pin.name, args.version, args.cache)
    result = refresh(args.dest, pin, target, args.cache)
    status = "applied" if result.applied else "FAILED"
    text = f"{pin.version} -> {target.version} (sdist sha256 {target.sha256}): {status}\n{result.report}"
    if not result.applied:
        raise UpstreamError(text)
    if args.test:
        text += f"\nthe series' tests on {target.version}: {run_series_tests(args.dest.resolve(), args.timeout)}"
    return text
