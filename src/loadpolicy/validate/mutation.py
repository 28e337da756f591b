"""One mutation: the exact text that carries a behaviour, what replaces it, and the check that must catch it."""

from __future__ import annotations

from dataclasses import dataclass

from loadpolicy.validate.checks import Check, Target


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    breaks: str  # the behaviour, in words
    target: Target
    path: str
    old: str
    new: str
    check: Check
    expects: str  # a pattern (re.search) the check's failure must contain: the judge and message that catch it
