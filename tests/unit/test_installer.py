"""Which pip the upstream commands run: this environment's, or the base interpreter's aimed at it (tox-uv)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loadpolicy.upstream import installer
from loadpolicy.upstream.pin import UpstreamError


def _without_pip_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """This environment has no pip (tox-uv); other interpreters are asked for real."""
    real = installer.has_pip
    monkeypatch.setattr(installer, "has_pip", lambda python: python != sys.executable and real(python))


def test_this_environment_s_pip_first() -> None:
    assert installer.pip_command() == [sys.executable, "-m", "pip"]


def test_an_environment_without_pip_uses_the_base_interpreter_s_aimed_at_it(monkeypatch: pytest.MonkeyPatch) -> None:
    base = "/opt/base/bin/python3"  # the interpreter tox-uv made the environment from, which has pip
    monkeypatch.setattr(installer, "has_pip", lambda python: python == base)
    monkeypatch.setattr(sys, "_base_executable", base, raising=False)
    assert installer.pip_command() == [base, "-m", "pip", "--python", sys.executable]


def test_no_pip_anywhere_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_pip_here(monkeypatch)
    monkeypatch.setattr(sys, "_base_executable", "/bin/false", raising=False)
    with pytest.raises(UpstreamError, match="uv_seed = true"):
        installer.pip_command()


def test_looking_for_pip_leaves_setuptools_importable() -> None:
    """A first `loadpolicy dev validate` fetches the sdist with pip, then builds DeepSpeed's op (`import setuptools`).

    Looking pip up in-process disabled setuptools' distutils shim and that import failed its assertion.
    """
    script = "from loadpolicy.upstream.installer import pip_command; pip_command(); import setuptools"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-500:]
