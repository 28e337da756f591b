"""The same 2-rank load on the pristine and on the patched tree: stock 5.23.0 fails EP under ZeRO-3, patched loads it.

Runs the worker of the series' own test (`tests/deepspeed/test_deepspeed_expert_parallel.py` in the patched tree) with
each tree's `src` first on PYTHONPATH, so both trees are exercised in one environment. Needs the patched tree installed
(tox -e patches).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from loadpolicy_lab.harness.launch import Tree
from loadpolicy_lab.harness.trees import prepare_trees


ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"
CACHE = ROOT / "build" / "cache"


def _load_tree_tests(tree: Path) -> ModuleType:
    path = tree / "tests" / "deepspeed" / "test_deepspeed_expert_parallel.py"
    spec = importlib.util.spec_from_file_location("tree_test_load_policy", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same stock and patched trees `loadpolicy dev validate` builds."""
    built = prepare_trees(tmp_path_factory.mktemp("validate"), PATCHES, CACHE)
    return built[Tree.STOCK], built[Tree.PATCHED]


def test_ep_under_zero3_fails_on_stock_and_loads_on_patched(trees: tuple[Path, Path], tmp_path: Path) -> None:
    # the patched tree's own tests import from the installed transformers: it must be the patched one (tox -e patches)
    import transformers.integrations.load_policy  # noqa: F401

    pristine, patched = trees
    tree_tests = _load_tree_tests(patched)
    checkpoint = tmp_path / "checkpoint"
    import torch

    torch.manual_seed(0)
    model = tree_tests.Qwen3MoeForCausalLM(tree_tests.tiny_qwen3_moe_config())
    model.save_pretrained(checkpoint)
    args = [str(checkpoint), "Qwen3MoeForCausalLM", "ep_zero3"]
    outcomes = {}
    for name, tree in (("stock", pristine), ("patched", patched)):
        out = tmp_path / name
        out.mkdir()
        env = {"ZERO3_CONFIG": json.dumps(tree_tests.ZERO3_CONFIG), "PYTHONPATH": str(tree / "src")}
        outcomes[name] = tree_tests.run_torchrun(tree_tests.WORKER, args, str(out), env=env)
    for rank, result in enumerate(outcomes["stock"]):
        assert "not compatible with passing a `device_map`" in result.get("error", ""), f"stock rank {rank}: {result}"
    for rank, result in enumerate(outcomes["patched"]):
        assert "error" not in result, f"patched rank {rank}: {result.get('traceback')}"
        assert result["policy"] == "EPMeta"
        assert result["on_meta"] == []
        assert result["experts"], f"patched rank {rank}: no expert parameter was compared"
        assert all(equal for _, _, equal in result["experts"].values())
        assert result.get("dense_unequal", []) == []  # every dense parameter equal to the one-process load
        assert result["max_abs_diff"] <= 1e-5


def test_every_mutation_finds_its_text_once_in_the_code_it_breaks(trees: tuple[Path, Path]) -> None:
    """`tox -e mutants` fails on a mutation whose text moved; this says so in `tox -e patches`, on every change of the
    series or of `policy.py`, without running the mutants (`loadpolicy dev mutants --check-table` checks the rest)."""
    from loadpolicy_lab.validate.mutants.table import MUTATIONS
    from loadpolicy_lab.validate.mutants.table_check import package_roots, text_problems

    _, patched = trees
    # the installed PEFT and DeepSpeed: this environment installs their series before these tests
    assert text_problems(MUTATIONS, package_roots(patched)) == []
