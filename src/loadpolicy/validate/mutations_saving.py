"""The mutations of saving: the saving branch, the partition writes, and a failure shared by every rank."""

from __future__ import annotations

from loadpolicy.validate.checks import EP_LOAD, EXPORT, MOE_ZERO3, UNITS, Target, in_tree
from loadpolicy.validate.mutation import Mutation


SAVING_MUTATIONS = (
    Mutation(
        "zero3init-saves-gathered",
        "dense ZeRO-3 that reads partitions writes them when saving (the saving branch)",
        Target.POLICY,
        "policy.py",
        "range\n        return SavingBranch.ZERO3_WRITE_PARTITIONS if self.reads_partitions",
        "range\n        return SavingBranch.GATHER_TO_WRITER if self.reads_partitions",
        UNITS,
        "FAILED \\S*::test_scenario_selects_variant_with_stock_decisions\\[ZeRO-3 dense\\]",
    ),
    Mutation(
        "save-gathers-instead-of-writing-partitions",
        "save_pretrained takes the saving branch the policy decides (every rank writes its partitions)",
        Target.TREE,
        "modeling_utils.py",
        "if writes_zero3_partitions(model_to_save):",
        "if False:",
        EXPORT,
        "rank \\d: saved by gathering, not by writing its own partitions",
    ),
    Mutation(
        "partition-writes-concatenate-reversed",
        "a concatenated tensor's partition is written back to its sources in order (gate before up)",
        Target.TREE,
        "integrations/deepspeed_partition_reads.py",
        "part.write_from(part_start, part_end, values[done : done + count])",
        "part.write_from(part_start, part_end, values[done : done + count].flip(0))",
        MOE_ZERO3,
        "saved tensors differ from the checkpoint's: \\[",
    ),
    Mutation(
        "partition-writes-expert-rows-of-rank-0",
        "an expert shard's partition is written at its own experts' rows of the saved tensors",
        Target.TREE,
        "integrations/deepspeed_partition_writes.py",
        "tensor = _Narrowed(tensor, 0, first, expected[0])",
        "tensor = _Narrowed(tensor, 0, 0, expected[0])",
        EP_LOAD,
        "saved tensors differ from the checkpoint's: \\[[^\\]]*experts",
    ),
    Mutation(
        "partition-write-failure-not-shared",
        "a rank that fails while writing its partitions makes every rank raise, naming it",
        Target.TREE,
        "integrations/deepspeed_partition_writes.py",
        '    _raise_if_any_rank_failed(error, "writing the partitions")',
        "    pass",
        in_tree("test_a_rank_that_fails_while_writing_fails_every_rank_and_leaves_nothing_that_loads"),
        "failed while writing the partitions on rank\\(s\\) \\[1\\]",
    ),
)
