"""The mutation table of `patches/upstream-ep`: the smaller EP-under-ZeRO-3 PRs proposed upstream, a series of their
own on the pristine sources. Each row breaks one behaviour in a fresh checkout of that series and runs the test of the
series that guards it (`tests/deepspeed/test_deepspeed_expert_parallel.py`, `RUN_SLOW=1`), which must fail; the tests
first pass unmutated. Needs DeepSpeed with `deepspeed:place-expert-parameters` installed (the environments of
`tox -e mutants` and `tox -e stack` have the DeepSpeed series).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.checkout import checkout


TEST_FILE = "tests/deepspeed/test_deepspeed_expert_parallel.py"
TRAINS = "like_one_process"
SAVES = "saves"
MODELING, DEEPSPEED = "src/transformers/modeling_utils.py", "src/transformers/integrations/deepspeed.py"
MIXIN, ACCELERATE, TRAINER = (
    "src/transformers/distributed/mixin.py",
    "src/transformers/integrations/accelerate.py",
    ("src/transformers/trainer.py"),
)


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    path: str
    old: str
    new: str
    tests: str  # pytest's -k expression over TEST_FILE

    def apply(self, tree: Path) -> str | None:
        """Mutate `tree`; the original text, or None where the text to mutate is not found exactly once."""
        original = (tree / self.path).read_text(encoding="utf-8")
        if original.count(self.old) != 1:
            return None
        (tree / self.path).write_text(original.replace(self.old, self.new), encoding="utf-8")
        return original


ROWS = (
    Row("experts-not-placed", DEEPSPEED, "    place_expert_parameters(experts, ep_size)\n", "", TRAINS),
    Row(
        "no-hand-over",
        MODELING,
        "            hand_expert_shards_to_deepspeed(model, distributed_config.ep_size)\n",
        "            pass\n",
        TRAINS,
    ),
    Row(
        "zero3-init-under-ep",
        MODELING,
        "        if is_deepspeed_zero3_enabled() and not is_expert_parallel_under_zero3(distributed_config):\n",
        "        if is_deepspeed_zero3_enabled():\n",
        TRAINS,
    ),
    Row(
        "zero3-loader-under-ep",
        MODELING,
        "and not self._is_expert_parallel_under_zero3()\n",
        "\n",
        TRAINS,
    ),
    Row(
        "fsdp2-under-ep-zero3",
        MIXIN,
        "        if distributed_config.dp_size > 1 and not is_expert_parallel_under_zero3(distributed_config):",
        "        if distributed_config.dp_size > 1:",
        TRAINS,
    ),
    Row(
        "device-map-refused",
        ACCELERATE,
        "        if is_deepspeed_zero3_enabled() and not is_expert_parallel_under_zero3(distributed_config):",
        "        if is_deepspeed_zero3_enabled():",
        TRAINS,
    ),
    Row(
        "fsdp-plan-under-ep-zero3",
        MIXIN,
        "        dp_size = 1 if zero3_owns_data_parallel else distributed_config.dp_size",
        "        dp_size = distributed_config.dp_size",
        "dense_modules_an_ep_plan_shards",
    ),
    Row(
        "dense-ep-rules-kept",
        MIXIN,
        'if style in ("ep_dispatch_experts", "grouped_gemm")',
        "if style",
        "dense_modules_an_ep_plan_shards",
    ),
    Row(
        "sub-model-zero3-init",
        MODELING,
        "                init_contexts.append(set_zero3_state())\n",
        "                pass\n",
        "sub_model_built_inside",
    ),
    Row(
        "experts-on-another-dim-taken",
        DEEPSPEED,
        "                if param.data.placements != (Shard(0),):",
        "                if False:",
        "another_dim",
    ),
    Row(
        "layout-unchecked",
        DEEPSPEED,
        "    if any(size != 1 for size in sizes.values()):",
        "    if False:",
        "other_layouts_are_refused",
    ),
    Row(
        "old-deepspeed-unchecked",
        DEEPSPEED,
        '    if not hasattr(deepspeed.moe.utils, "place_expert_parameters"):',
        "    if False:",
        "without_expert_placement",
    ),
    Row(
        "trainer-takes-sharded-model",
        TRAINER,
        "        if self.is_distributed_loading_by_transformers and self.is_deepspeed_enabled and shards_experts:",
        "        if False:",
        "refuses",
    ),
    Row(
        "zero2-not-refused",
        MODELING,
        "        check_deepspeed_stage_for_expert_parallel(distributed_config)\n",
        "",
        "zero2",
    ),
    Row(
        "zero2-check-passes",
        DEEPSPEED,
        "        and not is_deepspeed_zero3_enabled()\n    ):",
        "        and False\n    ):",
        "zero2",
    ),
    Row("experts-saved-as-shards", DEEPSPEED, "                    tensor = torch.cat(shards)\n", "", SAVES),
    Row(
        "saving-leaves-experts-to-deepspeed",
        MIXIN,
        "            return gather_expert_parallel_state_dict(model_to_save, state_dict, save_on_this_rank)\n",
        "            pass\n",
        SAVES,
    ),
    Row(
        "trainer-consolidates-experts-first",
        TRAINER,
        "                    state_dict = None  # `save_pretrained` gathers experts and partitions",
        "                    state_dict = self.accelerator.get_state_dict(self.deepspeed)  #",
        "the_trainer_saves",
    ),
    Row(
        "trainer-saves-on-the-writer-only",
        TRAINER,
        "        sharded = self.is_distributed_loading_by_transformers or self._saves_expert_shards_on_every_rank()",
        "        sharded = self.is_distributed_loading_by_transformers",
        "the_trainer_saves",
    ),
)


def _pytest(tree: Path, tests: str, timeout: float) -> tuple[str, str]:
    """ "passed", "failed" (a test failed) or "error" (nothing ran: collection, timeout), and what pytest said."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "RUN_SLOW": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST_FILE, "-k", tests]
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "error", f"no result within {timeout:.0f}s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    summary = lines[-1] if lines else ""
    failed = [line for line in lines if line.startswith("FAILED")]
    said = " | ".join([*failed[:2], summary.strip("= ")])
    # pytest's summary counts failed tests (subtests included); exit 1 is "tests ran and some failed"
    ran_and_failed = done.returncode == 1 and re.search(r"\b\d+ failed\b", summary) is not None
    return ("passed" if done.returncode == 0 else "failed" if ran_and_failed else "error"), said


def run_upstream_ep(patches: Path, cache: Path, out: Path, names: list[str], timeout: float) -> tuple[bool, str]:
    """Every row (or those `names`): (all caught and every baseline passing, the table as markdown)."""
    rows = [row for row in ROWS if not names or row.name in names]
    if unknown := sorted(set(names) - {row.name for row in ROWS}):
        raise ValueError(f"unknown upstream-ep mutations {unknown}; accepted: {[row.name for row in ROWS]}")
    tree = (out / "upstream-ep").resolve()  # the tests run from the tree: PYTHONPATH must not be relative
    checkout(tree, patches / "upstream-ep", cache)
    lines = ["| mutation | file | tests (-k) | outcome | s | what failed |", "|---|---|---|---|---:|---|"]
    ok = True
    for tests in sorted({row.tests for row in rows}):
        started = time.monotonic()
        result, said = _pytest(tree, tests, timeout)
        ok &= result == "passed"
        outcome = "passes" if result == "passed" else "FAILS unmutated"
        lines.append(f"| (baseline) | | `{tests}` | {outcome} | {time.monotonic() - started:.0f} | {said} |")
    for row in rows:
        started, original = time.monotonic(), row.apply(tree)
        if original is None:
            ok = False
            lines.append(f"| {row.name} | {row.path} | `{row.tests}` | NOT APPLIED | 0 | text not found once |")
            continue
        try:
            result, said = _pytest(tree, row.tests, timeout)
        finally:
            (tree / row.path).write_text(original, encoding="utf-8")
        # caught: a test ran and failed; a module that did not even import catches nothing
        ok &= result == "failed"
        outcome = {"failed": "caught", "passed": "NOT CAUGHT", "error": "NOT CAUGHT, nothing ran"}[result]
        lines.append(
            f"| {row.name} | {row.path} | `{row.tests}` | {outcome} | {time.monotonic() - started:.0f} | {said} |"
        )
    return ok, "\n".join(lines) + "\n"
