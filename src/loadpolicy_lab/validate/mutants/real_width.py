"""A check at a published width: what the tiny models cannot show (the logits of a sharded forward, a training step's
expert gradients at real sizes), run on the code under test as the patched tree.

One round of `ways` on `shape` (`perf rounds`: every load judged on its values and logits) or the training step of
`step_case` (`perf step`: losses, gradients and weights after the step against one process). The checkpoints are
built once under the table's `widths_checkpoints` (several GiB), with the stock tree's references beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadpolicy.errors import CommandError
from loadpolicy_lab.harness.launch import Tree
from loadpolicy_lab.models.published import SHAPES_BY_NAME, with_layers
from loadpolicy_lab.perf.rounds import render_rounds, rounds, ways_for
from loadpolicy_lab.perf.step_run import STEP_CASES, STEP_LAYERS, prepare_step, render_markdown, step_once
from loadpolicy_lab.perf.widths_run import MAX_GIB, prepare_checkpoint


# a real-width launch takes minutes on this machine: the table's per-launch bound is for the tiny models
REAL_WIDTH_TIMEOUT = 900.0


@dataclass(frozen=True, slots=True)
class RealWidth:
    shape: str
    ranks: int
    ways: tuple[str, ...] = ()  # one round of these (`perf.rounds` ways)
    step_case: str | None = None  # or the training step of this load (`perf.step_run.STEP_CASES`)

    @property
    def label(self) -> str:
        what = f"step of {self.step_case}" if self.step_case else f"one round of {', '.join(self.ways)}"
        return f"real width: {self.shape} x{self.ranks}, {what}"

    def problems(self) -> list[str]:
        """Why this check would select nothing today: a shape, way or step case that does not exist."""
        if self.shape not in SHAPES_BY_NAME:
            return [f"no published shape {self.shape!r}"]
        if self.step_case is not None and self.step_case not in {case.label for case in STEP_CASES}:
            return [f"no step case {self.step_case!r}"]
        try:
            ways_for(self.ways, [Tree.PATCHED.value])
        except CommandError as error:
            return [str(error)]
        return [] if self.ways or self.step_case else ["neither ways nor a step case"]


def prepare_real_width(check: RealWidth, stock: Path, checkpoints: Path) -> None:
    """Build `check`'s checkpoint and the stock tree's references once, before its baseline and its mutated runs
    read them side by side."""
    if check.step_case is not None:
        prepare_step(with_layers(SHAPES_BY_NAME[check.shape], STEP_LAYERS), checkpoints, stock, REAL_WIDTH_TIMEOUT)
    else:
        prepare_checkpoint(SHAPES_BY_NAME[check.shape], checkpoints, stock, MAX_GIB, REAL_WIDTH_TIMEOUT)


def passes_at_real_width(check: RealWidth, code: Path, stock: Path, checkpoints: Path, out: Path) -> tuple[bool, str]:
    """Run `check` with `code` (a folder holding `src`) as the patched tree: whether every launch passed its judge,
    and the report (its failures are what a row's `expects` searches)."""
    trees = {Tree.STOCK.value: stock, Tree.PATCHED.value: code}
    if check.step_case is not None:
        shape = with_layers(SHAPES_BY_NAME[check.shape], STEP_LAYERS)
        path, model_class, reference = prepare_step(shape, checkpoints, stock, REAL_WIDTH_TIMEOUT)
        case = next(case for case in STEP_CASES if case.label == check.step_case)
        row = step_once(
            path,
            model_class,
            reference,
            case,
            check.ranks,
            {Tree.STOCK: stock, Tree.PATCHED: code},
            out / "step",
            REAL_WIDTH_TIMEOUT,
        )
        problems = row.verdict.problems if row.verdict is not None else []
        return not row.failed, "\n".join([render_markdown([row], check.label), *problems])
    ways = ways_for(check.ways, [Tree.PATCHED.value])
    found = rounds(
        out,
        trees,
        shape=check.shape,
        ranks=check.ranks,
        ways=ways,
        count=1,
        timeout=REAL_WIDTH_TIMEOUT,
        checkpoints=checkpoints,
    )
    return not any(row.error for row in found), render_rounds(found, check.label)
