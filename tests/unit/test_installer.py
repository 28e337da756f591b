"""Which pip the upstream commands run: this environment's, or the base interpreter's aimed at it (tox-uv)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from loadpolicy.upstream import installer
from loadpolicy.upstream.pin import UpstreamError


def _without_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pip" else real(name, *a))


def test_this_environment_s_pip_first() -> None:
    assert installer.pip_command() == [sys.executable, "-m", "pip"]


def test_an_environment_without_pip_uses_the_base_interpreter_s_aimed_at_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_pip(monkeypatch)
    monkeypatch.setattr(sys, "_base_executable", sys.executable, raising=False)  # an interpreter that has pip
    assert installer.pip_command() == [sys.executable, "-m", "pip", "--python", sys.executable]


def test_no_pip_anywhere_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_pip(monkeypatch)
    monkeypatch.setattr(sys, "_base_executable", "/bin/false", raising=False)
    with pytest.raises(UpstreamError, match="uv_seed = true"):
        installer.pip_command()
