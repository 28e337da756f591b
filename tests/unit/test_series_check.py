"""`loadpolicy dev series test`: the steps `tox -e patches` runs, in the order each needs, stopping at the first
failure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from loadpolicy.errors import CommandError
from loadpolicy.upstream.series_check import Step, run_steps, series_steps


def _order(work: Path) -> list[str]:
    return [step.what for step in series_steps(work, Path("patches"), Path("cache"), Path("tests/patches"), Path("S"))]


def test_the_stack_record_first_and_the_deepspeed_and_peft_series_installed_before_any_transformers_test() -> None:
    order = _order(Path("/w"))
    assert order[0] == "the stack check's record"
    transformers_tests = min(order.index(w) for w in order if "repository's tests" in w or "series' own" in w)
    assert order.index("the DeepSpeed checkout") < order.index("the PEFT checkout") < transformers_tests
    assert (
        order.index("the transformers checkout") < order.index("the mutation table's fast check") < transformers_tests
    )


def test_every_checkout_is_made_under_work_from_the_series_given() -> None:
    steps = {step.what: step.argv for step in series_steps(Path("/w"), Path("p"), Path("c"), Path("t"), Path("S"))}
    assert steps["the DeepSpeed checkout"][3:] == (
        "checkout",
        "/w/deepspeed",
        "--patches",
        "p/deepspeed",
        "--install",
        "--cache",
        "c",
    )
    assert steps["the transformers checkout"][3:] == (
        "checkout",
        "/w/tf",
        "--patches",
        "p",
        "--install",
        "--cache",
        "c",
    )
    assert steps["the mutation table's fast check"][-1] == "/w/tf"


def test_the_first_failing_step_ends_the_run_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    steps = [
        Step("passes", (sys.executable, "-c", "pass")),
        Step("fails", (sys.executable, "-c", "raise SystemExit(3)")),
        Step("never runs", (sys.executable, "-c", "raise SystemExit(4)")),
    ]
    with pytest.raises(CommandError, match=r"step 2 of 3, fails, failed \(exit 3\)"):
        run_steps(steps)
    assert "never runs" not in capsys.readouterr().out
