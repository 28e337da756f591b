"""The pip that installs into, builds for and downloads for the running interpreter's environment.

tox-uv creates environments without pip. There, pip of the interpreter the environment was made from runs with
`--python` pointing at this environment (pip >= 22.3); if that has no pip either, the error says how to get one.
"""

from __future__ import annotations

import subprocess
import sys

from loadpolicy.upstream.pin import UpstreamError


def has_pip(python: str) -> bool:
    """Whether `python -m pip` runs, asked of a child process.

    Not `importlib.util.find_spec("pip")` in this one: setuptools' distutils shim takes a lookup of "pip" for pip
    running and hands `distutils` back to the standard library, and the next `import setuptools` (DeepSpeed's op
    build, through `torch.utils.cpp_extension`) then fails its assertion.
    """
    probe = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, check=False)
    return probe.returncode == 0


def pip_command(target: str | None = None) -> list[str]:
    """`python -m pip` for this environment, or the base interpreter's pip aimed at it; with `target`, a pip aimed
    at that interpreter's environment instead."""
    if has_pip(sys.executable):
        return [sys.executable, "-m", "pip", *(["--python", target] if target else [])]
    base = getattr(sys, "_base_executable", sys.executable)
    if has_pip(base):
        return [base, "-m", "pip", "--python", target or sys.executable]
    raise UpstreamError(
        f"No pip for {sys.executable}: this environment has none (tox-uv makes environments without it) and neither "
        f"has {base}. Install pip into either (`{base} -m ensurepip`), or set `uv_seed = true` for tox-uv."
    )


def run_pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*pip_command(), *args], capture_output=True, text=True, check=False)
