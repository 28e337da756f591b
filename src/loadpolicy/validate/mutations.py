"""What `loadpolicy dev mutants` breaks: one exact piece of text per behaviour, the check that must catch it, and the
reason it must be caught for."""

from __future__ import annotations

from dataclasses import dataclass

from loadpolicy.validate.checks import (
    COMPOSITE_EP_LOAD,
    DENSE_ZERO3,
    DISPATCH,
    EP_LOAD,
    EXPORT,
    MOE_ZERO3,
    QUANTIZED,
    SGD,
    UNITS,
    Check,
    Target,
    fault,
    in_tree,
)


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    breaks: str  # the behaviour, in words
    target: Target
    path: str
    old: str
    new: str
    check: Check
    expects: str  # a pattern (re.search) the check's failure must contain: the judge and message that catch it


# conversion_mapping.py's mixtral entry: the gate (w1) and up (w3) projections merged into gate_up_proj, in this order
MIXTRAL_GATE_UP = """"mixtral": [
            WeightRenaming(".block_sparse_moe.", ".mlp."),
            WeightConverter(
                source_patterns=[
                    ".experts.*.{first}.weight",
                    ".experts.*.{second}.weight","""


MUTATIONS = (
    Mutation(
        "transpose-checks-global-shape",
        "a sharded parameter's local shape decides a checkpoint transpose (qwen3_vl_moe's experts)",
        Target.TREE,
        "core_model_loading.py",
        "expected_shape = param._local_tensor.shape if is_dtensor(param) else param.shape",
        "expected_shape = param.shape",
        in_tree("test_a_shard_already_in_the_models_layout_is_not_transposed"),
        "attribute 'shape' do not match",
    ),
    Mutation(
        "ep-plan-shards-dense-mlp",
        "EPMeta leaves the dense modules an EP plan shards to ZeRO-3 (gemma4's mlp)",
        Target.TREE,
        "distributed/mixin.py",
        'if v in ("grouped_gemm", "ep_dispatch_experts")',
        "",
        EP_LOAD,
        "Expert shard `model\\.layers\\.\\d+\\.mlp\\.\\w+\\.weight` is not split by expert|parameters"
        " outside the experts differ from the stock one-process load",
    ),
    Mutation(
        "epmeta-refuses-device-map",
        "EPMeta admits the mesh-bound device_map",
        Target.POLICY,
        "policy.py",
        "device_map: ClassVar[DeviceMapRule] = DeviceMapRule.ADMIT_MESH_BOUND",
        "device_map: ClassVar[DeviceMapRule] = DeviceMapRule.REFUSE",
        UNITS,
        "FAILED \\S*::test_ep_meta_decisions",
    ),
    Mutation(
        "zero3init-plain-weight-init",
        "Zero3Init initialises missing weights gathered",
        Target.POLICY,
        "policy.py",
        "weight_init: ClassVar[WeightInit] = WeightInit.GATHERED",
        "weight_init: ClassVar[WeightInit] = WeightInit.PLAIN",
        UNITS,
        "FAILED \\S*::test_zero3_init_decisions",
    ),
    Mutation(
        "quantized-build-unmarked",
        "MetaShardOnRead marks a quantized build under ZeRO-3",
        Target.POLICY,
        "policy.py",
        "return InitContext.META_QUANTIZED if self.zero3_enabled and self.quantized else InitContext.META",
        "return InitContext.META",
        UNITS,
        "FAILED \\S*::test_meta_shard_on_read_decisions\\[True-True",
    ),
    Mutation(
        "epmeta-nested-zero3-init",
        "EPMeta's sub-models are built on meta, not under a nested zero.Init",
        Target.POLICY,
        "policy.py",
        "nested_from_config_opens_zero3_init: ClassVar[bool] = False  # a nested zero.Init",
        "nested_from_config_opens_zero3_init: ClassVar[bool] = True  # a nested zero.Init",
        UNITS,
        "FAILED \\S*::test_ep_meta_decisions",
    ),
    Mutation(
        "composite-sub-model-zero3-init",
        "a composite model's sub-models stay on their EPMeta parent's meta device, under no nested zero.Init",
        Target.TREE,
        "modeling_utils.py",
        'needs_zero3_init = needs_zero3_init and torch.empty(0).device.type != "meta"',
        "needs_zero3_init = needs_zero3_init",
        COMPOSITE_EP_LOAD,
        "Cannot copy out of meta tensor",
    ),
    Mutation(
        "zero3-fsdp-admitted",
        "ZeRO-3 with FSDP2 is refused",
        Target.POLICY,
        "policy.py",
        "if (sizes.fsdp > 1 and not token_dispatch) or (sizes.dp_replicate > 1 and not sizes.expert_parallel):",
        "if False:",
        UNITS,
        "FAILED \\S*::(test_impossible_combination_is_refused_naming_values\\[ZeRO-3"
        " \\+ FSDP2\\]|test_selection_invariants)",
    ),
    Mutation(
        "gate-2-reverted",
        "EP under ZeRO-3 keeps its mesh-bound device_map (gate 2 of the loading map)",
        Target.TREE,
        "integrations/accelerate.py",
        'if set(device_map) != {""}:',
        "if True:",
        EP_LOAD,
        "loads each rank's shards onto the single device its mesh binds",
    ),
    Mutation(
        "shared-conversion-bug",
        "mixtral's w1/w3 merge order (a bug the patched tree's one-process load would share)",
        Target.TREE,
        "conversion_mapping.py",
        MIXTRAL_GATE_UP.format(first="w1", second="w3"),
        MIXTRAL_GATE_UP.format(first="w3", second="w1"),
        EP_LOAD,
        "gate_up_proj: not this rank's slice of the checkpoint",
    ),
    Mutation(
        "quantizer-map-refused",
        "ZeRO-3 refuses only the device_map passed in, not the quantizer's",
        Target.TREE,
        "modeling_utils.py",
        "check_device_map_for_load_policy(requested_device_map, load_policy)",
        "check_device_map_for_load_policy(device_map, load_policy)",
        QUANTIZED,
        "DeepSpeed Zero-3 is not compatible with passing a `device_map`",
    ),
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
        "token-dispatch-refused",
        "ZeRO-3 owns the fsdp ranks of token dispatch (DistributedConfig(fsdp_size=W, ep_size=E))",
        Target.TREE,
        "integrations/load_policy.py",
        "token_dispatch = sizes.expert_parallel and sizes.tp == 1 and sizes.dp_replicate == 1",
        "token_dispatch = False",
        DISPATCH,
        "ZeRO-3 cannot be combined with FSDP2 data parallelism \\(fsdp_size=2",
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
        "capability-checked-after-reading",
        "DeepSpeed's expert placement is checked before any weight is read (the EP PR's hand-over)",
        Target.TREE,
        "modeling_utils.py",
        "check_deepspeed_holds_expert_groups()  # before any weight is read",
        "pass",
        in_tree("test_a_deepspeed_without_expert_placement_is_refused_before_any_weight_is_read"),
        "'ImportError: Expert parallelism under ZeRO-3 needs a DeepSpeed' not found in 'OSError",
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
        "save-repeats-own-shard",
        "save_pretrained gathers every rank's expert shards (not one rank's, repeated)",
        Target.TREE,
        "integrations/deepspeed.py",
        "                    tensor = torch.cat(shards)",
        "                    tensor = torch.cat([tensor] * len(shards))",
        EXPORT,
        "reloaded model\\.layers\\.\\d+\\.mlp\\.experts\\.\\w+ differs from one process",
    ),
    Mutation(
        "agreement-off",
        "ranks agree on the load inputs before the first collective",
        Target.TREE,
        "integrations/deepspeed.py",
        "    if (exchange := _load_policy_store()) is None:\n        return\n    store, rank, world_size = exchange",
        "    return\n    store, rank, world_size = _load_policy_store()",
        fault("plain load, ZeRO-3 config on rank 0 only, process group up"),
        "expected an error with 'Ranks disagree on how to load.*got RuntimeError:"
        " Ranks \\[1\\] did not finish loading",
    ),
    Mutation(
        "errors-stay-on-their-rank",
        "a loading error on one rank stops every rank with its message",
        Target.TREE,
        "modeling_utils.py",
        "    @fail_together\n",
        "",
        fault("truncated safetensors, one rank's view"),
        "rank 0: expected an error with '`from_pretrained` failed on rank\\(s\\) \\[1\\].*got None",
    ),
    Mutation(
        "zero3-reads-partitions-off",
        "dense ZeRO-3 with flat partitions reads each rank's partitions",
        Target.POLICY,
        "policy.py",
        "return Zero3Init(reads_partitions=True), reason",
        "return Zero3Init(), reason",
        UNITS,
        "FAILED \\S*::test_scenario_selects_variant_with_stock_decisions\\[ZeRO-3 dense\\]",
    ),
    Mutation(
        "partition-reads-fall-back",
        "the patched tree loads dense ZeRO-3 by partition reads, not silently by gather-and-copy",
        Target.TREE,
        "integrations/load_policy.py",
        "return Zero3Init(reads_partitions=True), reason",
        "return Zero3Init(), reason",
        DENSE_ZERO3,
        "loading branch zero3_gather_and_copy, expected zero3_read_partitions",
    ),
    Mutation(
        "partition-read-neighbour-range",
        "each rank reads its own flat range of every parameter (DeepSpeed's partition layout)",
        Target.TREE,
        "integrations/deepspeed_partition_reads.py",
        "start = group_rank * partition_numel",
        "start = (group_rank + 1) % group_size * partition_numel",
        MOE_ZERO3,
        "gathered values differ from the stock one-process load",
    ),
    Mutation(
        "partition-read-concatenates-in-reverse",
        "a converter's concatenation is read in the order of its sources (gate before up in gate_up_proj)",
        Target.TREE,
        "integrations/deepspeed_partition_reads.py",
        "tensors = {op.get_target_pattern(mapping.target_patterns): _Concatenated(parts, op.dim)}",
        "tensors = {op.get_target_pattern(mapping.target_patterns): _Concatenated(parts[::-1], op.dim)}",
        MOE_ZERO3,
        "gathered values differ from the stock one-process load: \\[[^\\]]*gate_up_proj",
    ),
    Mutation(
        "ep-reads-partitions-off",
        "EP under ZeRO-3 with flat partitions reads partitions",
        Target.POLICY,
        "policy.py",
        "default = EPMeta(ep_size=sizes.ep, reads_partitions=inputs.zero3_flat_partitions)",
        "default = EPMeta(ep_size=sizes.ep)",
        UNITS,
        "FAILED \\S*::test_scenario_selects_variant_with_stock_decisions\\[ZeRO-3 \\+ EP, flat partitions\\]",
    ),
    Mutation(
        "ep-dense-read-whole",
        "the patched tree partitions an EP model before reading, dense weights included (EP partition reads)",
        Target.TREE,
        "integrations/load_policy.py",
        "default = EPMeta(ep_size=sizes.ep, reads_partitions=inputs.zero3_flat_partitions)",
        "default = EPMeta(ep_size=sizes.ep)",
        in_tree("test_ep_under_zero3_loads_expert_shards_with_single_process_logits"),
        'assertEqual\\(len\\(result\\[\\"partitioned\\"\\]\\), result\\[\\"parameters\\"\\]\\)',
    ),
    Mutation(
        "ep-partition-reads-first-experts",
        "each rank reads its own experts' rows of a checkpoint tensor (EP partition reads)",
        Target.TREE,
        "integrations/deepspeed.py",
        "first = torch.distributed.get_rank(expert_parallel_group) * shape[0]",
        "first = 0",
        in_tree("test_ep_under_zero3_loads_expert_shards_with_single_process_logits"),
        "is not rank \\d's slice of the checkpoint",
    ),
    Mutation(
        "ep-experts-partitioned-over-the-world",
        "an expert shard is partitioned over its expert data-parallel group at load, not the world",
        Target.TREE,
        "integrations/deepspeed.py",
        "                if is_expert:\n                    _join_deepspeed_expert_groups(local,",
        "                if False:\n                    _join_deepspeed_expert_groups(local,",
        in_tree("test_ep_under_zero3_reads_partitions_experts_over_the_ranks_that_hold_them"),
        "'error' unexpectedly found in \\{'error': 'RuntimeError: You set `ignore_mismatched_sizes` to `False`",
    ),
    Mutation(
        "partition-reads-built-with-broadcast",
        "a dense model whose partitions are read is built without zero.Init's broadcast (DeepSpeed series)",
        Target.TREE,
        "modeling_utils.py",
        "zero_init = zero3_init_for_partition_reads if reads_partitions else deepspeed.zero.Init",
        "zero_init = deepspeed.zero.Init",
        in_tree("test_dense_model_reads_partitions_equal_to_the_checkpoint"),
        'assertEqual\\(result\\[\\"broadcasts\\"\\] == 0, result\\[\\"skips_broadcast\\"\\]\\)',
    ),
    Mutation(
        "ep-partition-reads-built-with-broadcast",
        "an EP model is partitioned before reading without zero.Init's broadcast (DeepSpeed series)",
        Target.TREE,
        "integrations/deepspeed.py",
        "            zero3_init_for_partition_reads(\n                module=module,",
        '            __import__("deepspeed").zero.Init(\n                module=module,',
        in_tree("test_ep_under_zero3_reads_partitions_experts_over_the_ranks_that_hold_them"),
        'assertEqual\\(result\\[\\"broadcasts\\"\\] == 0, result\\[\\"skips_broadcast\\"\\]\\)',
    ),
    Mutation(
        "partition-reads-keep-the-broadcast",
        "a partition-read build asks a DeepSpeed that offers it to skip the broadcast (DeepSpeed series)",
        Target.TREE,
        "integrations/deepspeed.py",
        '        kwargs["sync_module_states"] = False',
        "        pass",
        in_tree("test_a_model_whose_partitions_are_read_is_built_without_the_broadcast_where_deepspeed_offers_it"),
        'assertEqual\\(result\\[\\"broadcasts\\"\\] == 0, result\\[\\"skips_broadcast\\"\\]\\)',
    ),
    Mutation(
        "missing-expert-unnamed",
        "a checkpoint missing an expert's tensors fails naming them",
        Target.TREE,
        "modeling_utils.py",
        "if not ignore_mismatched_sizes:\n                raise_if_checkpoint_misses_merged_tensors(",
        "if False:\n                raise_if_checkpoint_misses_merged_tensors(",
        fault("checkpoint missing expert 3's weights"),
        'expected an error with \\"ValueError: The checkpoint lacks .*got'
        " RuntimeError: You set `ignore_mismatched_sizes`",
    ),
)
