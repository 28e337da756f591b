"""The checks a mutation must fail: the smallest parts of the validation, each runnable on a copy of the code.

A check runs a matrix launch, a parity case, a bad-input case, the unit tests or the patched tree's own tests, with a
given copy of the patched tree's `src` (or of our package) in place of the real one, and says whether it passed and,
when it did not, everything it said about why (`mutants` matches the reason against what the mutation expects).
"""

from __future__ import annotations

import enum
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import loadpolicy
from loadpolicy_lab.faults.cases import FAULT_CASES
from loadpolicy_lab.faults.run import run_fault
from loadpolicy_lab.harness.launch import Launcher, Tree, run_bounded
from loadpolicy_lab.matrix.cases import Run, Scenario
from loadpolicy_lab.matrix.run import run_scenario
from loadpolicy_lab.parity.cases import ParityCase, Trainer
from loadpolicy_lab.parity.run import run_parity
from loadpolicy_lab.validate.mutants.real_width import RealWidth, passes_at_real_width


# the folders of the patched tree's tests `_in_tree` selects from (`-k`), relative to the checkout: every file the
# series adds there (as `tox -e patches` runs them), so a test that moves to a new file is still found
IN_TREE_FOLDERS = ("tests/deepspeed", "tests/distributed", "tests/utils")


OUR_PACKAGE = Path(loadpolicy.__file__).resolve().parent


class Target(enum.StrEnum):
    TREE = "patched tree"  # paths relative to src/transformers of the patched checkout
    POLICY = "loadpolicy"  # paths relative to our package
    # paths relative to the installed (patched) peft or deepspeed package, copied into the patched tree's `src`, which
    # every launch puts first on its path
    PEFT = "peft"
    DEEPSPEED = "deepspeed"


def installed_package(target: Target) -> Path | None:
    """The installed package a PEFT or DeepSpeed mutation copies (with its series where the environment installs it),
    if any."""
    found = importlib.util.find_spec(target.value)
    return None if found is None or found.origin is None else Path(found.origin).parent


@dataclass(frozen=True, slots=True)
class Setup:
    trees: dict[Tree, Path]
    checkpoints: Path
    variants: dict[str, Path]
    tests: Path
    timeout: float
    # the stock tree's parity references, by what trains them (`parity.run`): not the code under test, so every
    # parity run of a table shares them, as the cases of one validation do
    references: dict[str, Path] = field(default_factory=dict)
    # where the real-width checks' checkpoints are built once (several GiB each)
    widths_checkpoints: Path = Path("build/widths/checkpoints")


TEST_DEFINITION = re.compile(r"^\s*(?:async\s+)?def (test_\w+)\(", re.MULTILINE)


def in_tree_files(checkout: Path) -> list[Path]:
    """The test files of the checkout's folders an in-tree check selects from."""
    return [path for folder in IN_TREE_FOLDERS for path in sorted((checkout / folder).glob("test_*.py"))]


def defined_tests(path: Path) -> set[str]:
    return set(TEST_DEFINITION.findall(path.read_text(encoding="utf-8")))


def files_defining(checkout: Path, test: str) -> list[Path]:
    return [path for path in in_tree_files(checkout) if test in defined_tests(path)]


@dataclass(frozen=True, slots=True)
class Check:
    """The smallest part of the validation that must fail when its behaviour breaks."""

    label: str
    run: Run | None = None
    parity: ParityCase | None = None
    fault: str | None = None  # a FAULT_CASES name, at 2 ranks
    unit_tests: tuple[str, ...] = ()  # test files under Setup.tests
    in_tree: str | None = None  # a `-k` selection of the patched tree's own DeepSpeed tests (`RUN_SLOW=1`)
    real_width: RealWidth | None = None  # a run at a published width (`real_width`)

    def passes(self, code: Path, setup: Setup, out: Path) -> tuple[bool, str]:
        """Run this check with `code` as the patched tree (or as our package's parent, for unit tests)."""
        trees = {Tree.STOCK: setup.trees[Tree.STOCK], Tree.PATCHED: code}
        if self.run is not None:
            outcome = run_scenario(self.run, trees, setup.checkpoints, out, setup.timeout)
            details = [a.detail for a in outcome.archs if not a.passed]
            return outcome.met_expectation, outcome.launch_error or "; ".join(details)
        if self.parity is not None:  # its one-process reference runs on the stock tree: shared by every run
            parity = run_parity(self.parity, trees, setup.checkpoints, out, setup.timeout, setup.references)
            return parity.passed, parity.detail
        if self.fault is not None:
            case = next(c for c in FAULT_CASES if c.name == self.fault)
            fault = run_fault(case, 2, code, setup.variants, out)
            return fault.passed, fault.detail
        if self.real_width is not None:
            stock = setup.trees[Tree.STOCK]
            return passes_at_real_width(self.real_width, code, stock, setup.widths_checkpoints.resolve(), out)
        if self.in_tree is not None:  # the tree's tests, run on `code`: its `src` goes first on the path
            checkout = setup.trees[Tree.PATCHED]
            options = ["-c", str(checkout / "pyproject.toml"), "--rootdir", str(checkout), "-k", self.in_tree]
            # the files that define it (pytest then collects only those), else every file: nothing is selected
            tests = files_defining(checkout, self.in_tree) or in_tree_files(checkout)
            return _pytest_passes(code / "src", tests, out, setup.timeout, options, {"RUN_SLOW": "1"})
        return _pytest_passes(code, [setup.tests / name for name in self.unit_tests], out, setup.timeout)


def _pytest_passes(
    code: Path,
    tests: list[Path],
    out: Path,
    timeout: float,
    options: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[bool, str]:
    """pytest on `tests` with `code` first on the path, in a session of its own: at the bound, or when the run is
    stopped, the test's own launches (torchrun and its ranks) go with it."""
    out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        *(options or []),
        *map(str, tests),
    ]
    log = out / "pytest.log"
    returncode = run_bounded(command, env, log, timeout)
    if returncode is None:
        return False, f"timed out after {timeout:.0f}s"
    output = log.read_text(encoding="utf-8", errors="replace")
    if returncode == 0:
        return True, "passes"
    # the failing tests and their assertion messages first, then the rest of the output, for `expects` to search
    lines = output.strip().splitlines()
    summary = [line for line in lines if line.startswith(("FAILED", "ERROR", "E   "))]
    return False, "\n".join([*summary, "--- output ---", *lines[-200:]])


# The checks more than one mutation runs
UNITS = Check("unit tests: variants, selection table", unit_tests=("test_variants.py", "test_selection_table.py"))
EP_LOAD = Check("matrix: EP under ZeRO-3, torchrun x2", run=Run(Scenario.EP_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2))
COMPOSITE_EP_LOAD = Check(
    "matrix: composite EP under ZeRO-3, torchrun x2",
    run=Run(Scenario.COMPOSITE_EP_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2),
)
QUANTIZED = Check(
    "matrix: quantized ZeRO-3, torchrun x2", run=Run(Scenario.QUANTIZED_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
)
SGD = Check(
    "parity: qwen3_moe, DeepSpeed SGD x2",
    parity=ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd"),
)
DISPATCH = Check(
    "parity: qwen3_moe, DeepSpeed SGD x2, token dispatch",
    parity=ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dispatch=True),
)
MOE_ZERO3 = Check(
    "matrix: MoE ZeRO-3 (conversions), torchrun x2", run=Run(Scenario.MOE_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
)
DENSE_ZERO3 = Check(
    "matrix: dense ZeRO-3, torchrun x2", run=Run(Scenario.DENSE_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
)
EXPORT = Check(
    "parity: mixtral, DeepSpeed SGD x2, save -> reload on stock",
    parity=ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True),
)
# the same, each rank saving into a directory of its own: save_pretrained gathers to rank 0 (no partition writes)
GATHERED_EXPORT = Check(
    "parity: mixtral, DeepSpeed SGD x2, save into each rank's own directory (gathered) -> reload on stock",
    parity=ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True, export_unshared=True),
)

RESUME_AT_ANOTHER_TOPOLOGY = Check(
    "parity: qwen3_moe, DeepSpeed AdamW x4 dp 2 x ep 2, token dispatch, Universal Checkpoint -> resumed x2",
    parity=ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, dp=2, dispatch=True, resumed_ranks=2),
)


LORA_ON_EXPERTS = Check(
    "parity: qwen3_moe, TRL SFT + LoRA on attention and experts x2, token dispatch, adapter saved -> reloaded",
    parity=ParityCase(
        "qwen3_moe", 2, Trainer.TRL_SFT, clip=0.0, optimizer="sgd", dispatch=True, lora=True, lr=1e-2, export=True
    ),
)


def in_tree(test: str) -> Check:
    return Check(f"in-tree: {test}, torchrun x2", in_tree=test)


def fault(name: str) -> Check:
    return Check(f"bad input: {name}, x2", fault=name)
