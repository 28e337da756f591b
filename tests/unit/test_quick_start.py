"""README's Quick start, line by line, in a fresh venv holding nothing but `pip install .` of a copy of the repository.

The user commands must work without torch, transformers or DeepSpeed installed, and answer `--help` and `--version`
at once.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import statistics
import subprocess
import time
import venv
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
FENCE = "`" * 3
# 0.1 s here; the bound leaves room for a loaded CI machine while a command that imports torch (seconds) fails it
PROMPT_S = 1.0


def quick_start_lines() -> list[tuple[str, str]]:
    """(command, its `# comment`) for each line of the sh block under README's "Quick start"."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(rf"{FENCE}sh\n(.*?){FENCE}", section, re.DOTALL)
    lines = []
    for line in block.splitlines():
        command, _, comment = line.partition("#")
        if command.strip():
            lines.append((command.strip(), comment.strip()))
    return lines


def _copy_of_the_repository(dest: Path) -> Path:
    """The files a clone has: tracked, and new ones not ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a copy of the repository, a venv with nothing installed in it)."""
    base = tmp_path_factory.mktemp("quick-start")
    clone = _copy_of_the_repository(base / "loadpolicy")
    venv.create(base / "venv", with_pip=True)
    return clone, base / "venv" / "bin"


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # the venv alone: nothing from this interpreter's environment leaks in through PYTHONPATH
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def _as_in_the_venv(command: str, bin_dir: Path) -> list[str]:
    words = shlex.split(command)
    if words[:2] == ["pip", "install"]:
        return [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", *words[2:]]
    assert words[0] == "loadpolicy", f"the Quick start runs only pip and loadpolicy commands: {command!r}"
    return [str(bin_dir / "loadpolicy"), *words[1:]]


def test_the_quick_start_runs_as_written_without_torch(fresh: tuple[Path, Path]) -> None:
    clone, bin_dir = fresh
    lines = quick_start_lines()
    assert lines[0][0] == "pip install .", lines
    assert len(lines) >= 3, lines
    for command, comment in lines:
        result = _run(_as_in_the_venv(command, bin_dir), clone)
        assert "Traceback" not in result.stderr, f"{command}\n{result.stderr}"
        assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stderr}"
        if comment in ("EPMeta", "Zero3Init", "MetaShardOnRead"):
            assert result.stdout.startswith(f"policy: {comment}"), result.stdout
    for heavy in ("torch", "transformers", "deepspeed"):
        assert _run([str(bin_dir / "python"), "-c", f"import {heavy}"], clone).returncode != 0, heavy


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_answer_at_once(fresh: tuple[Path, Path], flag: str) -> None:
    clone, bin_dir = fresh
    if not (bin_dir / "loadpolicy").exists():
        _run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "."], clone)
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        result = _run([str(bin_dir / "loadpolicy"), flag], clone)
        seconds.append(time.perf_counter() - start)
        assert result.returncode == 0, result.stderr
    assert statistics.median(seconds) < PROMPT_S, seconds


def test_the_users_install_holds_the_product_without_the_lab(fresh: tuple[Path, Path]) -> None:
    """`pip install .` carries the policy and its commands; the harness and suites stay in the checkout."""
    clone, bin_dir = fresh
    if not (bin_dir / "loadpolicy").exists():
        _run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "."], clone)
    files = _run([str(bin_dir / "python"), "-m", "pip", "show", "--files", "loadpolicy"], clone).stdout
    assert "loadpolicy/policy.py" in files, files
    assert "loadpolicy_lab" not in files, files
    outside = _run([str(bin_dir / "python"), "-c", "import loadpolicy_lab"], clone.parent)
    assert outside.returncode != 0
    lab_command = _run([str(bin_dir / "loadpolicy"), "dev", "perf", "bench", "--runs", "1"], clone.parent)
    assert lab_command.returncode == 2, lab_command
    assert "Traceback" not in lab_command.stderr, lab_command.stderr
    assert "loadpolicy_lab" in lab_command.stderr, lab_command.stderr
    assert "pip install -e '.[dev]'" in lab_command.stderr, lab_command.stderr
