"""Rows at a published width: what only a real-width run shows. Not in the default table (each takes minutes and a
checkpoint of several GiB): `loadpolicy dev mutants --real-widths`."""

from __future__ import annotations

from loadpolicy_lab.validate.mutants.checks import Check, Target
from loadpolicy_lab.validate.mutants.real_width import RealWidth
from loadpolicy_lab.validate.mutants.row import Mutation


# both EPMeta launches of a round (reads one at a time, reads in flight): the tp = ep inference path's forward
QWEN3_LOGITS = Check(
    "real width: qwen3-30b-a3b x2, EPMeta loads' logits",
    real_width=RealWidth(
        "qwen3-30b-a3b", 2, ways=("EPMeta: partition reads, one read at a time", "EPMeta: partition reads")
    ),
)
STEP = Check(
    "real width: deepseek-v2-lite x2, the EPMeta step",
    real_width=RealWidth("deepseek-v2-lite", 2, step_case="EPMeta: partition reads"),
)

REAL_WIDTH_ROWS = (
    Mutation(
        "expert-outputs-left-unreduced",
        "AllReduceEP's all-reduce dropped: each rank's partial expert outputs left unreduced in a tp = ep forward "
        "(the weights stay the checkpoint's, so only the logits can see it)",
        Target.TREE,
        "distributed/expert_parallel.py",
        "        return _AllReduceForward.apply(expert_output, ep_group)\n",
        "        return expert_output\n",
        QWEN3_LOGITS,
        r"logits \S+ \(root mean square\) from the float32 forward's, over 2x",
    ),
    Mutation(
        "expert-gradients-left-unscaled",
        "the hand-over to DeepSpeed's expert groups forgets that the ranks of a tp = ep group share one batch: "
        "DeepSpeed's average over the world halves every expert gradient",
        Target.TREE,
        "integrations/deepspeed.py",
        "    gradient_scale = model._tp_size\n",
        "    gradient_scale = 1\n",
        STEP,
        r"\.experts\.\S*: grad root mean square error",
    ),
)
