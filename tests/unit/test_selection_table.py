"""The selection table: every scenario of the loading map, the decisions stock 5.23.0 makes there, and the refusals.

The expected decisions are read off transformers 5.23.0 (`modeling_utils.py`, `integrations/accelerate.py`), with
the line that makes each one. The policy must reproduce them exactly, except for EP under ZeRO-3, which must take the
standard path at every gate (and admit the mesh-bound device_map).
"""

from __future__ import annotations

import dataclasses

import pytest

from loadpolicy.policy import (
    AfterLoading,
    DenseWeights,
    DeviceMapRule,
    EPMeta,
    InitContext,
    LoadingBranch,
    LoadInputs,
    LoadPolicyError,
    MetaShardOnRead,
    MissingKeys,
    ParallelSizes,
    PolicyName,
    SavingBranch,
    WeightInit,
    Zero3Init,
    decision_table,
    select_load_policy,
)


def decisions(
    init: InitContext, device_map: DeviceMapRule, branch: LoadingBranch, missing: MissingKeys, weights: WeightInit
) -> dict[str, object]:
    return {
        "init_context": init,
        # 1b: stock never opens a nested zero.Init: under Zero3Init `set_zero3_state` (modeling_utils.py:211) is set,
        # under ZeRO-3 + quantized `set_quantized_state` is, and without ZeRO-3 the check (1435) is False.
        "nested_from_config_opens_zero3_init": False,
        "device_map": device_map,
        "loading_branch": branch,
        "missing_keys": missing,
        "weight_init": weights,
        # 6 and 7 are new: stock has no EP under ZeRO-3 to hand over, so it shards dense weights as the TP plan says
        # and returns the model as loaded.
        "dense_weights": DenseWeights.AS_PLANNED,
        "after_loading": AfterLoading.AS_LOADED,
        # 8: stock gathers to the writing rank (`accelerator.get_state_dict`, the TP/FSDP gathers of save_pretrained)
        "saving_branch": SavingBranch.GATHER_TO_WRITER,
    }


# Without ZeRO-3: meta init (3829-3831), no device_map check (136), standard loader (4521), materialize (4849),
# plain init (4904).
STANDARD = decisions(
    InitContext.META,
    DeviceMapRule.PASS_THROUGH,
    LoadingBranch.SHARD_ON_READ,
    MissingKeys.MATERIALIZE,
    WeightInit.PLAIN,
)
# Dense ZeRO-3: zero.Init (3815-3825), device_map refused (136-137), the ZeRO-3 loader (4521), early return (4849),
# GatheredParameters (4904).
ZERO3 = decisions(
    InitContext.ZERO3_INIT,
    DeviceMapRule.REFUSE,
    LoadingBranch.ZERO3_GATHER_AND_COPY,
    MissingKeys.LEAVE_TO_ZERO3,
    WeightInit.GATHERED,
)
# Inside an outer zero.Init (`_is_ds_init_called`): nothing added at 3815, everything else as dense ZeRO-3.
ZERO3_OUTER = ZERO3 | {"init_context": InitContext.OUTER_ZERO3_INIT}
# Not stock: dense ZeRO-3 where DeepSpeed keeps flat partitions: built on meta and partitioned before reading, each
# rank reads its own from the files, and writes its own into them when saving.
ZERO3_READS = ZERO3 | {
    "init_context": InitContext.META,
    "loading_branch": LoadingBranch.ZERO3_READ_PARTITIONS,
    "saving_branch": SavingBranch.ZERO3_WRITE_PARTITIONS,
}
# ZeRO-3 + quantized: meta + set_quantized_state (3827-3828), device_map still refused (136 has no quantized check),
# and every `and not is_quantized` sends the rest down the standard path.
ZERO3_QUANTIZED = STANDARD | {"init_context": InitContext.META_QUANTIZED, "device_map": DeviceMapRule.REFUSE}
# EP under ZeRO-3 (not stock: it fails at 136-137 today): the standard path, admitting the mesh-bound device_map.
# Dense weights are left whole for ZeRO-3, and the expert shards handed to DeepSpeed's expert groups.
EP_ZERO3 = STANDARD | {
    "device_map": DeviceMapRule.ADMIT_MESH_BOUND,
    "dense_weights": DenseWeights.LEFT_TO_ZERO3,
    "after_loading": AfterLoading.DEEPSPEED_EXPERT_GROUPS,
}
# Not stock: EP under ZeRO-3 where DeepSpeed keeps flat partitions: the meta model is partitioned before reading
# (dense weights over the world, experts over their expert data-parallel group): later gates are ZeRO-3's.
EP_ZERO3_READS = EP_ZERO3 | {
    "loading_branch": LoadingBranch.ZERO3_READ_PARTITIONS,
    "missing_keys": MissingKeys.LEAVE_TO_ZERO3,
    "weight_init": WeightInit.GATHERED,
    "saving_branch": SavingBranch.ZERO3_WRITE_PARTITIONS,
}

SCENARIOS = [
    # (scenario, inputs, variant, decisions)
    ("plain", LoadInputs(zero3_enabled=False), MetaShardOnRead(), STANDARD),
    ("plain quantized", LoadInputs(zero3_enabled=False, quantized=True), MetaShardOnRead(quantized=True), STANDARD),
    ("TP", LoadInputs(zero3_enabled=False, sizes=ParallelSizes(tp=2)), MetaShardOnRead(), STANDARD),
    ("EP tp=ep", LoadInputs(zero3_enabled=False, sizes=ParallelSizes(tp=4, ep=4)), MetaShardOnRead(), STANDARD),
    ("EP fsdp=ep", LoadInputs(zero3_enabled=False, sizes=ParallelSizes(fsdp=2, ep=2)), MetaShardOnRead(), STANDARD),
    ("FSDP2", LoadInputs(zero3_enabled=False, sizes=ParallelSizes(fsdp=2)), MetaShardOnRead(), STANDARD),
    (
        "HSDP",
        LoadInputs(zero3_enabled=False, sizes=ParallelSizes(fsdp=2, dp_replicate=2)),
        MetaShardOnRead(),
        STANDARD,
    ),
    ("PP", LoadInputs(zero3_enabled=False, sizes=ParallelSizes(pp=2)), MetaShardOnRead(), STANDARD),
    (
        "ZeRO-3 quantized",
        LoadInputs(zero3_enabled=True, quantized=True),
        MetaShardOnRead(zero3_enabled=True, quantized=True),
        ZERO3_QUANTIZED,
    ),
    ("ZeRO-3 dense, hpZ / NVMe / quantized weights", LoadInputs(zero3_enabled=True), Zero3Init(), ZERO3),
    (
        "ZeRO-3 dense",
        LoadInputs(zero3_enabled=True, zero3_flat_partitions=True),
        Zero3Init(reads_partitions=True),
        ZERO3_READS,
    ),
    (
        "ZeRO-3 dense, outer zero.Init, flat partitions",
        LoadInputs(zero3_enabled=True, outer_zero3_init=True, zero3_flat_partitions=True),
        Zero3Init(under_outer_init=True),
        ZERO3_OUTER,
    ),
    (
        "ZeRO-3 nested",
        LoadInputs(zero3_enabled=True, outer_zero3_init=True),
        Zero3Init(under_outer_init=True),
        ZERO3_OUTER,
    ),
    ("ZeRO-3 + EP", LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=2, ep=2)), EPMeta(ep_size=2), EP_ZERO3),
    ("ZeRO-3 + EP 4", LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=4, ep=4)), EPMeta(ep_size=4), EP_ZERO3),
    (
        "ZeRO-3 + EP, flat partitions",
        LoadInputs(zero3_enabled=True, zero3_flat_partitions=True, sizes=ParallelSizes(tp=2, ep=2)),
        EPMeta(ep_size=2, reads_partitions=True),
        EP_ZERO3_READS,
    ),
    (
        "ZeRO-3 + EP, token dispatch, flat partitions",
        LoadInputs(zero3_enabled=True, zero3_flat_partitions=True, sizes=ParallelSizes(fsdp=4, ep=2)),
        EPMeta(ep_size=2, reads_partitions=True),
        EP_ZERO3_READS,
    ),
    # world = dp x ep: ZeRO-3, not FSDP2, owns the data-parallel replicas (not stock: fails at gate 2 today)
    (
        "ZeRO-3 + EP, dp_replicate=2",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=2, ep=2, dp_replicate=2)),
        EPMeta(ep_size=2),
        EP_ZERO3,
    ),
    # token dispatch: every rank its own batch, ZeRO-3 owns the fsdp ranks (efsdp x ep), no FSDP2, no TP
    (
        "ZeRO-3 + EP, token dispatch",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(fsdp=2, ep=2)),
        EPMeta(2),
        EP_ZERO3,
    ),
    (
        "ZeRO-3 + EP 2 over 4 ranks, token dispatch",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(fsdp=4, ep=2)),
        EPMeta(ep_size=2),
        EP_ZERO3,
    ),
]


@pytest.mark.parametrize(
    ("inputs", "variant", "expected"), [row[1:] for row in SCENARIOS], ids=[row[0] for row in SCENARIOS]
)
def test_scenario_selects_variant_with_stock_decisions(
    inputs: LoadInputs, variant: object, expected: dict[str, object]
) -> None:
    policy = select_load_policy(inputs)
    assert policy == variant
    assert decision_table(policy) == expected


def test_explicitly_requesting_the_default_changes_nothing() -> None:
    for _, inputs, variant, expected in SCENARIOS:
        requested = dataclasses.replace(inputs, requested=variant.name)  # type: ignore[attr-defined]
        policy = select_load_policy(requested)
        assert policy == variant
        assert decision_table(policy) == expected


def test_meta_shard_on_read_can_be_requested_for_dense_zero3() -> None:
    policy = select_load_policy(LoadInputs(zero3_enabled=True, requested=PolicyName.META_SHARD_ON_READ))
    assert policy == MetaShardOnRead(zero3_enabled=True)
    # Shard-on-read under ZeRO-3: the standard loader, but a user device_map is still refused (ZeRO-3 places).
    assert decision_table(policy) == STANDARD | {"device_map": DeviceMapRule.REFUSE}


REFUSALS = [
    # (case, inputs, substrings the message must contain: the offending values and the accepted ones)
    (
        "ZeRO-3 + FSDP2",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(fsdp=2)),
        ["fsdp_size=2", "Accepted under ZeRO-3: fsdp_size=1", "DistributedConfig(fsdp_size=<world size>, ep_size=E)"],
    ),
    (
        "ZeRO-3 + FSDP2 beside tp = ep",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(fsdp=2, tp=2, ep=2)),
        ["fsdp_size=2", "tp_size=2", "DistributedConfig(fsdp_size=<world size>, ep_size=E)"],
    ),
    (
        "ZeRO-3 + FSDP2 beside dp_replicate",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(fsdp=2, ep=2, dp_replicate=2)),
        ["fsdp_size=2", "dp_replicate_size=2", "DistributedConfig(tp_size=E, ep_size=E"],
    ),
    (
        "ZeRO-3 + HSDP replicas",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(dp_replicate=2)),
        ["dp_replicate_size=2", "dp_replicate_size=1"],
    ),
    ("ZeRO-3 + PP", LoadInputs(zero3_enabled=True, sizes=ParallelSizes(pp=2)), ["pp_size=2", "pp_size=1"]),
    (
        "ZeRO-3 + TP without EP",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=2)),
        ["tp_size=2, ep_size=1", "tp_size=1", "ep_size > 1"],
    ),
    (
        "ZeRO-3 + EP + quantized",
        LoadInputs(zero3_enabled=True, quantized=True, sizes=ParallelSizes(tp=2, ep=2)),
        ["ep_size=2", "quantized", "ep_size=1"],
    ),
    (
        "ZeRO-3 + EP inside an outer zero.Init",
        LoadInputs(zero3_enabled=True, outer_zero3_init=True, sizes=ParallelSizes(tp=2, ep=2)),
        ["ep_size=2", "outer deepspeed.zero.Init", "ep_size=1"],
    ),
    (
        "explicit EPMeta without EP",
        LoadInputs(zero3_enabled=True, requested=PolicyName.EP_META),
        ["'EPMeta' was requested", "ep_size=1", "'Zero3Init', 'MetaShardOnRead'"],
    ),
    (
        "explicit EPMeta without ZeRO-3",
        LoadInputs(zero3_enabled=False, sizes=ParallelSizes(tp=2, ep=2), requested=PolicyName.EP_META),
        ["'EPMeta' was requested", "zero3_enabled=False", "'MetaShardOnRead'"],
    ),
    (
        "explicit Zero3Init without ZeRO-3",
        LoadInputs(zero3_enabled=False, requested=PolicyName.ZERO3_INIT),
        ["'Zero3Init' was requested", "zero3_enabled=False", "'MetaShardOnRead'"],
    ),
    (
        "explicit Zero3Init with EP",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=2, ep=2), requested=PolicyName.ZERO3_INIT),
        ["'Zero3Init' was requested", "ep_size=2", "'EPMeta'"],
    ),
    (
        "explicit Zero3Init for a quantized model",
        LoadInputs(zero3_enabled=True, quantized=True, requested=PolicyName.ZERO3_INIT),
        ["'Zero3Init' was requested", "quantized=True", "'MetaShardOnRead'"],
    ),
    (
        "explicit MetaShardOnRead for EP under ZeRO-3",
        LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=2, ep=2), requested=PolicyName.META_SHARD_ON_READ),
        ["'MetaShardOnRead' was requested", "ep_size=2", "'EPMeta'"],
    ),
    (
        "explicit MetaShardOnRead inside an outer zero.Init",
        LoadInputs(zero3_enabled=True, outer_zero3_init=True, requested=PolicyName.META_SHARD_ON_READ),
        ["'MetaShardOnRead' was requested", "outer_zero3_init=True", "'Zero3Init'"],
    ),
]


@pytest.mark.parametrize(("inputs", "needles"), [row[1:] for row in REFUSALS], ids=[row[0] for row in REFUSALS])
def test_impossible_combination_is_refused_naming_values(inputs: LoadInputs, needles: list[str]) -> None:
    with pytest.raises(LoadPolicyError) as excinfo:
        select_load_policy(inputs)
    message = str(excinfo.value)
    for needle in needles:
        assert needle in message, f"{needle!r} missing from: {message}"


def test_load_policy_error_is_a_value_error() -> None:
    # transformers raises ValueError for bad loading arguments; callers that catch it keep working.
    assert issubclass(LoadPolicyError, ValueError)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_parallel_sizes_refuse_non_positive_integers(bad: object) -> None:
    with pytest.raises(LoadPolicyError, match=r"`ep_size` must be an integer >= 1, got"):
        ParallelSizes(ep=bad)  # type: ignore[arg-type]
