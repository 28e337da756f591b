"""The rows of saving: the saving branch, the partition writes, the gathered save where the ranks do not share the
directory, a failure shared by every rank, and a PEFT adapter's save."""

from __future__ import annotations

from loadpolicy_lab.validate.mutants.checks import (
    EP_LOAD,
    EXPORT,
    GATHERED_EXPORT,
    LORA_ON_EXPERTS,
    MOE_ZERO3,
    UNITS,
    Target,
    in_tree,
)
from loadpolicy_lab.validate.mutants.row import Mutation


SAVING_ROWS = (
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
        '    raise_if_any_rank_failed(error, "Saving ZeRO-3 partitions failed while writing the partitions")',
        "    pass",
        in_tree("test_a_rank_that_fails_while_writing_fails_every_rank_and_leaves_nothing_that_loads"),
        "failed while writing the partitions on rank\\(s\\) \\[1\\]",
    ),
    Mutation(
        "save-repeats-own-shard",
        "save_pretrained gathers every rank's expert shards where the ranks do not share the directory (not one"
        " rank's, repeated)",
        Target.TREE,
        "integrations/deepspeed.py",
        "                    tensor = torch.cat(shards)",
        "                    tensor = torch.cat([tensor] * len(shards))",
        # the parity case that saves by partition writes never gathers: this one's ranks save apart
        GATHERED_EXPORT,
        "reloaded model\\.layers\\.\\d+\\.mlp\\.experts\\.\\w+ differs from one process",
    ),
    Mutation(
        "lora-adapter-of-one-rank-saved",
        "PEFT saves the adapter of every expert, gathered from the ranks that hold them (PEFT series)",
        Target.PEFT,
        "utils/save_and_load.py",
        "        state_dict = _gather_expert_parallel_adapters(state_dict, expert_parallel_adapters, adapter_name)\n",
        "        pass\n",
        LORA_ON_EXPERTS,
        # rank 0's experts under the whole adapter's names: one process refuses the shapes
        "size mismatch for \\S+experts\\S*\\.lora_[AB]\\.default\\.weight",
    ),
    Mutation(
        "trainer-saves-peft-adapter-unconsolidated",
        "the Trainer keeps DeepSpeed's consolidation of a PEFT adapter when the load policy saves the model",
        Target.TREE,
        "trainer.py",
        "if accept_exclude_frozen_parameters and _is_peft_model(self.model) and zero3_sharding:",
        "if False:",
        LORA_ON_EXPERTS,
        # the adapter's ZeRO-3 placeholders saved as they are
        "size mismatch for \\S+\\.lora_[AB]\\.default\\.weight: copying a param with shape torch\\.Size\\(\\[0\\]\\)",
    ),
)
