"""The tool's own errors and argument types: what a command reports as `loadpolicy <cmd>: error: ...`, exit 2.

`LoadPolicyError` (in `policy.py`) stays the policy's: an impossible combination of loading inputs, carried into
transformers. `CommandError` is everything else a command refuses or fails at; both print without a traceback.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


class CommandError(Exception):
    """A command cannot do what it was asked; the message names the bad value and what is accepted."""


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1, or an error naming what was given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _finite_number(text: str, accepted: str, ok: Callable[[float], bool]) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {accepted}, got {text!r}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"expected {accepted}, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds > 0, or an error naming what was given."""
    return _finite_number(text, "a number of seconds > 0", lambda value: value > 0)


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0, or an error naming what was given."""
    return _finite_number(text, "a number >= 0", lambda value: value >= 0)


def missing_extra(what: str, module: str, extra: str = "live") -> CommandError:
    """The error for a command that needs an optional package the user has not installed."""
    return CommandError(
        f"{what} needs {module!r}, which is not installed: pip install 'loadpolicy[{extra}]' "
        "(from this repository: pip install '.[live]')"
    )
