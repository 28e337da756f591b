"""`loadpolicy dev mutants` counts a mutation caught only for the reason it names."""

from __future__ import annotations

import re

from loadpolicy_lab.validate.mutants.run import Outcome, excerpt, judge
from loadpolicy_lab.validate.mutants.table import MUTATIONS


def test_a_failure_with_the_expected_message_is_caught() -> None:
    detail = "rank 0: ValueError: Ranks disagree on how to load (zero3_enabled: rank 0=True, rank 1=False)"
    assert judge(False, detail, r"Ranks disagree") is Outcome.CAUGHT


def test_a_timeout_or_a_crash_is_the_wrong_reason() -> None:
    assert judge(False, "timed out after 120s; rank 0 at 'from_pretrained'", r"Ranks disagree") is Outcome.WRONG_REASON
    assert judge(False, "RuntimeError: chunk expects chunks to be greater than 0", r"differ") is Outcome.WRONG_REASON


def test_a_check_that_passes_on_mutated_code_did_not_catch_it() -> None:
    assert judge(True, "passes", r"anything") is Outcome.NOT_CAUGHT


def test_only_passing_baselines_and_caught_mutations_are_ok() -> None:
    assert {o for o in Outcome if o.ok} == {Outcome.PASSES, Outcome.CAUGHT}


def test_every_mutation_names_a_reason_that_is_a_pattern() -> None:
    for mutation in MUTATIONS:
        assert mutation.expects.strip(), mutation.name
        re.compile(mutation.expects)
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)


def test_the_excerpt_shows_the_expected_reason() -> None:
    detail = "x" * 500 + " Ranks disagree on how to load " + "y" * 500
    assert "Ranks disagree" in excerpt(detail, r"Ranks disagree")
    assert excerpt("a | b", None) == "a / b"
