"""The committed series: listing, headers, and the generated policy module matching its source (no network)."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from loadpolicy import policy
from loadpolicy.upstream.carry import TRANSFORMERS_MODULE
from loadpolicy.upstream.pin import UpstreamError, read_pin
from loadpolicy.upstream.series import GroupSize, group_sizes, lint_series, read_series
from loadpolicy.upstream.stack import node_ids_in_source


PATCHES = Path(__file__).resolve().parents[2] / "patches"
# the fork's own form of EP under ZeRO-3 (its upstream form is patches/upstream-ep), and the generated module after it
FORK_EP = "fork-only: EP under ZeRO-3 as the load policy"
FORK_GENERATED = "fork-only: the generated module"


def _carried_upstream(tmp_path: Path) -> ModuleType:
    """The policy module as the fork's own EP patches leave it (its EP under ZeRO-3 group adds it, a later patch may
    edit it), before the generated module replaces it, executed on its own: it needs only stdlib. Only the hunks for
    that file are applied, in series order, with `git apply --include`."""
    series = read_series(PATCHES)
    adders = [p for p in series.paths if f"--- /dev/null\n+++ b/{TRANSFORMERS_MODULE}\n" in p.read_text("utf-8")]
    assert len(adders) == 1, f"exactly one patch must add {TRANSFORMERS_MODULE}, found {adders}"
    ep_group = next(names for label, names in series.groups if label.startswith(FORK_EP))
    assert adders[0].name in ep_group, "the fork's EP under ZeRO-3 patches must add it"
    generated = next(names for label, names in series.groups if label.startswith(FORK_GENERATED))
    before_generated = series.paths[: series.names.index(generated[0])]
    touching = [p for p in before_generated if f"+++ b/{TRANSFORMERS_MODULE}\n" in p.read_text("utf-8")]
    subprocess.run(["git", "apply", f"--include={TRANSFORMERS_MODULE}", *map(str, touching)], cwd=tmp_path, check=True)
    source = (tmp_path / TRANSFORMERS_MODULE).read_text(encoding="utf-8")
    module = ModuleType("carried_load_policy")
    sys.modules[module.__name__] = module  # dataclasses look their module up while building the classes
    exec(compile(source, TRANSFORMERS_MODULE, "exec"), module.__dict__)
    return module


# Every decision policy.py's table names, but gate 7 (what happens after loading, added later in the EP PR); gate 8
# (saving) is compared where the stack carries it
DECISIONS = tuple(name for name in policy.decision_table(policy.EPMeta(ep_size=2)) if name != "after_loading")


# Decisions the upstream module does not carry, and what stands for them there: missing weights are initialised
# gathered exactly where the missing keys are ZeRO-3's (one decision, two gates), and `_from_config` never opens a
# zero.Init inside a parent built on the meta device (a rule of the gate, the same for every policy).
CARRIED_AS = {
    "weight_init": lambda policy: "gathered" if policy.missing_keys.value == "leave_to_zero3" else "plain",
    "nested_from_config_opens_zero3_init": lambda policy: False,
}


def _outcome(module: Any, error: type[Exception], inputs: Any) -> tuple[str, dict[str, object]]:
    try:
        policy = module.select_load_policy(inputs)
    except error:
        return "refused", {}
    decisions = {
        name: getattr(policy, name) if hasattr(policy, name) else CARRIED_AS[name](policy) for name in DECISIONS
    }
    fields = dataclasses.asdict(policy)
    return type(policy).__name__, {k: getattr(v, "value", v) for k, v in (decisions | fields).items()}


def test_the_module_the_upstream_stack_carries_decides_as_policy_py_for_every_input(tmp_path: Path) -> None:
    """The upstream PRs carry their own, smaller module in transformers' idiom (the EP PR adds it, the token
    dispatch PR admits token dispatch); as the stack leaves it, it must select and decide as `policy.py` does."""
    carried = _carried_upstream(tmp_path)
    compared = 0
    for zero3, quantized, outer, flat in itertools.product((False, True), repeat=4):
        for tp, ep, fsdp, pp, dp in itertools.product((1, 2, 4), (1, 2, 4), (1, 2), (1, 2), (1, 2)):
            sizes = {"tp": tp, "ep": ep, "fsdp": fsdp, "pp": pp, "dp_replicate": dp}
            flags = {"zero3_enabled": zero3, "quantized": quantized, "outer_zero3_init": outer}
            flags["zero3_flat_partitions"] = flat
            ours = policy.LoadInputs(**flags, sizes=policy.ParallelSizes(**sizes))  # type: ignore[arg-type]
            theirs = carried.LoadInputs(**flags, sizes=carried.ParallelSizes(**sizes))
            expected = _outcome(policy, policy.LoadPolicyError, ours)
            assert _outcome(carried, ValueError, theirs) == expected, (ours, expected)
            compared += 1
    assert compared == 16 * 72


def test_committed_series_lints_clean() -> None:
    assert lint_series(read_series(PATCHES)) == []


def test_pin_is_the_5_23_0_sdist() -> None:
    pin = read_pin(PATCHES / "UPSTREAM")
    assert (pin.name, pin.version) == ("transformers", "5.23.0")
    assert pin.sha256 == "19d647a4d5d903a7c644ca5cde2d86efc3dde7d8c687ae7988806ff2205efa71"


@pytest.fixture
def series_copy(tmp_path: Path) -> Path:
    shutil.copytree(PATCHES, tmp_path / "patches")
    return tmp_path / "patches"


def test_lint_finds_an_unlisted_patch(series_copy: Path) -> None:
    (series_copy / "0099-extra.patch").write_text("", encoding="utf-8")
    assert "0099-extra.patch: exists but is not listed in series" in lint_series(read_series(series_copy))


def test_lint_finds_a_patch_listed_twice_and_a_missing_one(series_copy: Path) -> None:
    lines = (series_copy / "series").read_text(encoding="utf-8").splitlines()
    first = read_series(series_copy).names[0]
    (series_copy / "series").write_text("\n".join([*lines, first, "0042-gone.patch"]) + "\n", encoding="utf-8")
    problems = lint_series(read_series(series_copy))
    assert f"series: {first} is listed twice" in problems
    assert "series: 0042-gone.patch is listed but does not exist" in problems


def test_lint_finds_a_missing_dep3_trailer(series_copy: Path) -> None:
    first = read_series(series_copy).paths[0]
    first.write_text(first.read_text(encoding="utf-8").replace("\nForwarded: no\n", "\n"), encoding="utf-8")
    assert f"{first.name}: missing DEP-3 trailer `Forwarded:`" in lint_series(read_series(series_copy))


def test_the_series_is_a_stack_of_pull_requests_then_the_fork_only_patches() -> None:
    series = read_series(PATCHES)
    labels = [label for label, _ in series.pull_requests()]
    assert [label.split(":")[0] for label in labels] == [f"PR {n}" for n in range(1, len(labels) + 1)]
    # the pull requests are small independent fixes, each applying to the pristine sources alone; the fork's own
    # forms of EP under ZeRO-3 and partition I/O follow as fork-only patches, the first of them its EP group
    assert len(labels) >= 8
    assert all(series.needs_nothing(label) for label in labels)
    assert series.groups[len(labels)][0].startswith(FORK_EP)
    ends = [end for _, end in series.pull_requests()]
    assert ends == sorted(ends)
    assert ends[-1] < len(series.names)  # the fork-only patches come last
    assert all(label.startswith("fork-only: ") for label, _ in series.groups[len(labels) :])


def test_lint_finds_a_patch_under_another_pull_request(series_copy: Path) -> None:
    text = (series_copy / "series").read_text(encoding="utf-8")
    lines = text.splitlines()
    pr2 = next(i for i, line in enumerate(lines) if line.startswith("# PR 2:"))
    moved = lines[pr2 - 1]  # PR 1's last patch, now listed under PR 2
    lines[pr2 - 1], lines[pr2] = lines[pr2], lines[pr2 - 1]
    (series_copy / "series").write_text("\n".join(lines) + "\n", encoding="utf-8")
    problems = lint_series(read_series(series_copy))
    assert any(
        p.startswith(f"{moved}: its Stack trailer says ") and "says 'PR 1:" in p.replace('"', "'") for p in problems
    )


def test_lint_finds_a_pull_request_after_the_fork_only_patches(series_copy: Path) -> None:
    lines = (series_copy / "series").read_text(encoding="utf-8").splitlines()
    pr2 = next(i for i, line in enumerate(lines) if line.startswith("# PR 2:"))
    group = lines[pr2 : pr2 + 2]
    rest = lines[:pr2] + lines[pr2 + 2 :]
    (series_copy / "series").write_text("\n".join(rest + group) + "\n", encoding="utf-8")
    problems = lint_series(read_series(series_copy))
    assert "series: `# PR 2: ZeRO-3 loading errors raised on every rank` comes after a fork-only group" in " ".join(
        problems
    )
    count = len(read_series(PATCHES).pull_requests())
    assert any(f"numbered {[1, *range(3, count + 1), 2]}" in p for p in problems), problems


def test_lint_finds_a_patch_outside_any_group(series_copy: Path) -> None:
    lines = (series_copy / "series").read_text(encoding="utf-8").splitlines()
    (series_copy / "series").write_text("\n".join(lines[1:]) + "\n", encoding="utf-8")
    problems = lint_series(read_series(series_copy))
    assert "series: every patch must be listed under a `# PR N: ...` or `# fork-only: ...` line" in problems


def test_bad_pin_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "UPSTREAM"
    path.write_text("name = transformers\nversion = 5.23.0\nsdist = x.tar.gz\nsha256 = abc\n", encoding="utf-8")
    with pytest.raises(UpstreamError, match="sha256 must be 64 lowercase hex digits, got 'abc'"):
        read_pin(path)


def test_the_tests_a_prefix_adds_are_found_by_name() -> None:
    source = "class T(Base):\n    def test_a(self): ...\n    def helper(self): ...\n"
    source += "def test_b(): ...\ndef other(): ...\n"
    assert node_ids_in_source(source, "tests/x.py") == {"tests/x.py::T::test_a", "tests/x.py::test_b"}


def test_group_sizes_count_the_lines_of_each_groups_hunks(tmp_path: Path) -> None:
    header = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\n"
    trailers = "Origin: vendor\nForwarded: no\nLast-Update: 2026-11-26\nStack: PR 1: one\nNeeds: none\n"
    body = (
        "---\n a | 1 +\n\n"
        "diff --git a/src/a.py b/src/a.py\n--- a/src/a.py\n+++ b/src/a.py\n@@ -1,2 +1,3 @@\n ctx\n-old\n+new\n+more\n"
        "diff --git a/tests/t.py b/tests/t.py\n--- /dev/null\n+++ b/tests/t.py\n@@ -0,0 +1,2 @@\n+one\n+two\n"
        "diff --git a/docs/d.md b/docs/d.md\n--- a/docs/d.md\n+++ b/docs/d.md\n@@ -1 +1 @@\n-x\n+y\n"
        "diff --git a/pkg/b.py b/pkg/b.py\n--- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1,2 @@\n x\n+y\n"
    )
    (tmp_path / "0001-x.patch").write_text(header + trailers + body, encoding="utf-8")
    (tmp_path / "series").write_text("# PR 1: one\n0001-x.patch\n", encoding="utf-8")
    assert group_sizes(read_series(tmp_path)) == [GroupSize("PR 1: one", 1, 3, 1, 2, alone=True)]
