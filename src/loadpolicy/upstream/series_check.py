"""`loadpolicy dev series test WORK`: the series checked, applied, installed and tested, in the order each needs.

First the full stack check's record for exactly this series and these pins; then the DeepSpeed series (its lint, a
checkout installed, its own tests), so that the PEFT and transformers trees run against it; then the PEFT series the
same way; then the transformers series: lint, a checkout installed, the mutation table's fast check on it, this
repository's tests of the patched tree, an import of every public name, and the series' own tests where transformers
keeps them. Each step runs as its own process with this interpreter; the first that fails ends the run, named.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.errors import CommandError


# what the steps need wherever they run, unless the environment says otherwise: the in-tree multi-process tests are
# `@slow`, as transformers gates them, and two ranks share this machine's cores
STEP_ENV = {"RUN_SLOW": "1", "OMP_NUM_THREADS": "1"}


@dataclass(frozen=True, slots=True)
class Step:
    what: str
    argv: tuple[str, ...]


def _loadpolicy(*words: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "loadpolicy", *words)


def _pytest(*words: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *words)


def _applied(label: str, series: Path, tree: Path, cache: Path) -> list[Step]:
    """A series linted (applied to a pristine checkout) and checked out at `tree`, installed."""
    cached = ("--cache", str(cache))
    return [
        Step(
            f"the {label} series' lint",
            _loadpolicy("dev", "series", "lint", "--apply", "--patches", str(series), *cached),
        ),
        Step(
            f"the {label} checkout", _loadpolicy("checkout", str(tree), "--patches", str(series), "--install", *cached)
        ),
    ]


def series_steps(work: Path, patches: Path, cache: Path, tests: Path, stack_record: Path) -> list[Step]:
    """Every step, in order, with `work` holding the three checkouts and `patches` the series' folder."""
    deepspeed, peft, tf = work / "deepspeed", work / "peft", work / "tf"
    record = _loadpolicy(
        "dev", "series", "lint", "--require-stack-record", str(stack_record), "--patches", str(patches)
    )
    # PEFT's own pytest settings, without the coverage plugin they ask for
    peft_settings = ("-o", "addopts=", "-c", str(peft / "pyproject.toml"), "--rootdir", str(peft))
    tf_settings = ("--rootdir", str(tf), "-c", str(tf / "pyproject.toml"))
    return [
        Step("the stack check's record", record),
        *_applied("DeepSpeed", patches / "deepspeed", deepspeed, cache),
        Step(
            "the DeepSpeed series' tests",
            _pytest("-c", str(deepspeed / "setup.cfg"), "--rootdir", str(deepspeed), str(deepspeed / "tests")),
        ),
        # the smaller EP PRs proposed upstream on the pristine sources: their tests are the stack check's
        Step(
            "the upstream-ep series' lint",
            _loadpolicy(
                "dev", "series", "lint", "--apply", "--patches", str(patches / "upstream-ep"), "--cache", str(cache)
            ),
        ),
        *_applied("PEFT", patches / "peft", peft, cache),
        Step(
            "the PEFT series' tests",
            _pytest(*peft_settings, str(peft / "tests" / "test_target_parameters_expert_parallel.py")),
        ),
        *_applied("transformers", patches, tf, cache),
        # in seconds: every row's text found once, every check selecting something, every row recorded on its path
        Step("the mutation table's fast check", _loadpolicy("dev", "mutants", "--check-table", str(tf))),
        Step("this repository's tests of the patched tree", _pytest(str(tests))),
        Step(
            "an import of every public name",
            (sys.executable, "-c", "from transformers import *; import transformers.integrations.load_policy"),
        ),
        # where transformers keeps them: the sdist carries none of these folders
        Step(
            "the series' own tests",
            _pytest(*tf_settings, *(str(tf / "tests" / f) for f in ("deepspeed", "distributed", "utils"))),
        ),
    ]


def check_series(work: Path, patches: Path, cache: Path, tests: Path, stack_record: Path) -> str:
    """Every step from fresh checkouts under `work`."""
    for tree in ("tf", "deepspeed", "peft"):
        shutil.rmtree(work / tree, ignore_errors=True)
    return run_steps(series_steps(work.resolve(), patches, cache, tests, stack_record))


def run_steps(steps: list[Step]) -> str:
    """Each step in turn; the first that fails ends the run, named with its place and exit status."""
    for index, step in enumerate(steps, start=1):
        print(f"[{index}/{len(steps)}] {step.what}: {' '.join(step.argv)}", flush=True)
        returncode = subprocess.run(step.argv, check=False, env=STEP_ENV | dict(os.environ)).returncode
        if returncode != 0:
            raise CommandError(f"step {index} of {len(steps)}, {step.what}, failed (exit {returncode})")
    return f"every step passed: {', '.join(step.what for step in steps)}"
