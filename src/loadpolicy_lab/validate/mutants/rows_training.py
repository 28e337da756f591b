"""The rows of training after loading: the expert shards handed to DeepSpeed's expert groups, their gradient
scale, LoRA adapters on the experts, and a Universal Checkpoint resumed at another topology."""

from __future__ import annotations

from loadpolicy_lab.validate.mutants.checks import (
    DISPATCH,
    LORA_ON_EXPERTS,
    RESUME_AT_ANOTHER_TOPOLOGY,
    SGD,
    Target,
    in_tree,
)
from loadpolicy_lab.validate.mutants.row import Mutation


TRAINING_ROWS = (
    Mutation(
        "expert-placement-untagged",
        "expert shards join DeepSpeed's expert groups (placement family)",
        Target.TREE,
        "integrations/deepspeed.py",
        "        moe_utils.place_expert_parameters([param], ep_size)\n        return",
        "        return",
        in_tree("test_expert_shards_are_placed_through_deepspeeds_api_where_it_has_one"),
        "expert shards placed through DeepSpeed's API",
    ),
    Mutation(
        "expert-gradient-unscaled",
        "expert gradients scaled back by tp_size (the ranks of a TP group share a batch)",
        Target.TREE,
        "integrations/deepspeed.py",
        'grad * gradient_scale if hasattr(param, "ds_id") else grad)',
        "grad)",
        SGD,
        "final model\\.layers\\.\\d+\\.mlp\\.experts\\.\\w+ differs by",
    ),
    Mutation(
        "expert-gradient-scaled-by-ep",
        "no expert gradient scale where every rank has its own batch (the scale is tp_size, not ep_size)",
        Target.TREE,
        "integrations/deepspeed.py",
        "gradient_scale = model._tp_size",
        "gradient_scale = ep_size",
        DISPATCH,
        "final model\\.layers\\.\\d+\\.mlp\\.experts\\.\\w+ differs by",
    ),
    Mutation(
        "experts-partitioned-over-ep-group",
        "DeepSpeed partitions an expert shard over the ranks that hold the same experts (efsdp), not its EP group",
        Target.TREE,
        "integrations/deepspeed.py",
        '    if hasattr(moe_utils, "place_expert_parameters"):  # DeepSpeed\'s'
        " public API for experts the caller placed\n"
        "        moe_utils.place_expert_parameters([param], ep_size)\n"
        "        return\n"
        "    # A DeepSpeed without it: the tags its AutoEP gives its own experts, set here\n"
        "    group_name, expert_data_parallel_group = _deepspeed_expert_groups(ep_size)\n",
        "    group_name, _ = _deepspeed_expert_groups(ep_size)\n"
        "    expert_data_parallel_group ="
        ' importlib.import_module("deepspeed.utils.groups")._get_expert_parallel_group(\n'
        "        group_name\n"
        "    )\n",
        DISPATCH,
        "expert shards partitioned over ranks .* \\(efsdp group\\)",
    ),
    Mutation(
        "expert-gradient-scaled-without-deepspeed",
        "the expert gradient scale applies only to a parameter DeepSpeed took over (the EP PR's hand-over)",
        Target.TREE,
        "integrations/deepspeed.py",
        'grad * gradient_scale if hasattr(param, "ds_id") else grad)',
        "grad * gradient_scale)",
        in_tree("test_a_model_deepspeed_never_wraps_keeps_unscaled_expert_gradients"),
        'assertLessEqual\\(result\\[\\"grad_diff\\"\\], 1e-5\\)',
    ),
    Mutation(
        "lora-adapters-of-experts-left-unplaced",
        "PEFT places the adapter of a rank's expert shard in that shard's expert groups (PEFT series)",
        Target.PEFT,
        "tuners/lora/layer.py",
        "        self._place_adapter_like_param(adapter_name)\n",
        "",
        LORA_ON_EXPERTS,
        # untagged, the adapter is not an expert shard: DeepSpeed broadcasts rank 0's and averages it over the world
        "rank \\d: (final )?\\S+experts\\S*\\.lora_[AB]\\.default\\.weight (differs by|has shape)",
    ),
    Mutation(
        "universal-experts-in-reversed-expert-parallel-order",
        "DeepSpeed records each caller-placed expert partition's expert-parallel rank (DeepSpeed series)",
        Target.DEEPSPEED,
        "runtime/engine.py",
        "                'ep_rank': groups._get_expert_parallel_rank(group_name),",
        "                'ep_rank': ep_size - 1 - groups._get_expert_parallel_rank(group_name),",
        RESUME_AT_ANOTHER_TOPOLOGY,
        # the experts of one rank resumed as another's
        "resumed|rank \\d: final \\S+experts\\.(gate_up|down)_proj differs by",
    ),
    Mutation(
        "universal-load-shares-the-step-counter",
        "a Universal Checkpoint load gives each optimizer sub-group its own step counter (DeepSpeed series)",
        Target.DEEPSPEED,
        "runtime/zero/stage3.py",
        "self.optimizer.state[fp32_param]['step'] = (state_step.clone()",
        "self.optimizer.state[fp32_param]['step'] = (state_step",
        RESUME_AT_ANOTHER_TOPOLOGY,
        # Adam's bias correction off after the resume: every weight moves differently
        "rank \\d: final \\S+ differs by",
    ),
)
