"""One row of the mutation table: the exact text that carries a behaviour, what replaces it, the check that must
catch it, and the reason it must be caught for."""

from __future__ import annotations

from dataclasses import dataclass

from loadpolicy_lab.validate.mutants.checks import Check, Target


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    breaks: str  # the behaviour, in words
    target: Target
    path: str  # relative to the target's package (`Target`)
    old: str  # found exactly once there
    new: str
    check: Check
    expects: str  # a pattern (re.search) the check's failure must contain: the judge and message that catch it
