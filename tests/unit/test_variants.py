"""Each variant's decisions, and properties the selector must keep for every input."""

from __future__ import annotations

import dataclasses
import os
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadpolicy.policy import (
    AfterLoading,
    DenseWeights,
    DeviceMapRule,
    EPMeta,
    InitContext,
    LoadingBranch,
    LoadInputs,
    LoadPolicy,
    LoadPolicyError,
    MetaShardOnRead,
    MissingKeys,
    ParallelSizes,
    PolicyName,
    SavingBranch,
    WeightInit,
    Zero3Init,
    check_ranks_agree,
    decision_table,
    inputs_as_dict,
    parse_policy_name,
    select_load_policy,
)


def test_zero3_init_decisions() -> None:
    assert Zero3Init().init_context is InitContext.ZERO3_INIT
    assert Zero3Init(under_outer_init=True).init_context is InitContext.OUTER_ZERO3_INIT
    for policy in (Zero3Init(), Zero3Init(under_outer_init=True)):
        assert policy.nested_from_config_opens_zero3_init is False
        assert policy.device_map is DeviceMapRule.REFUSE
        assert policy.loading_branch is LoadingBranch.ZERO3_GATHER_AND_COPY
        assert policy.missing_keys is MissingKeys.LEAVE_TO_ZERO3
        assert policy.weight_init is WeightInit.GATHERED


@pytest.mark.parametrize(
    ("zero3", "quantized", "init", "device_map"),
    [
        (False, False, InitContext.META, DeviceMapRule.PASS_THROUGH),
        (False, True, InitContext.META, DeviceMapRule.PASS_THROUGH),
        (True, False, InitContext.META, DeviceMapRule.REFUSE),
        (True, True, InitContext.META_QUANTIZED, DeviceMapRule.REFUSE),
    ],
)
def test_meta_shard_on_read_decisions(
    zero3: bool, quantized: bool, init: InitContext, device_map: DeviceMapRule
) -> None:
    policy = MetaShardOnRead(zero3_enabled=zero3, quantized=quantized)
    assert policy.init_context is init
    assert policy.device_map is device_map
    assert policy.nested_from_config_opens_zero3_init is False
    assert policy.loading_branch is LoadingBranch.SHARD_ON_READ
    assert policy.missing_keys is MissingKeys.MATERIALIZE
    assert policy.weight_init is WeightInit.PLAIN


def test_ep_meta_decisions() -> None:
    policy = EPMeta(ep_size=2)
    assert policy.init_context is InitContext.META
    assert policy.nested_from_config_opens_zero3_init is False
    assert policy.device_map is DeviceMapRule.ADMIT_MESH_BOUND
    assert policy.loading_branch is LoadingBranch.SHARD_ON_READ
    assert policy.missing_keys is MissingKeys.MATERIALIZE
    assert policy.weight_init is WeightInit.PLAIN
    assert policy.dense_weights is DenseWeights.LEFT_TO_ZERO3
    assert policy.after_loading is AfterLoading.DEEPSPEED_EXPERT_GROUPS


@pytest.mark.parametrize(
    ("policy", "field"),
    [(Zero3Init(), "under_outer_init"), (MetaShardOnRead(), "quantized"), (EPMeta(ep_size=2), "ep_size")],
)
def test_variants_are_immutable_values(policy: object, field: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(policy, field, 4)
    assert policy == dataclasses.replace(policy)  # type: ignore[type-var]
    assert hash(policy) == hash(dataclasses.replace(policy))  # type: ignore[type-var]


@pytest.mark.parametrize(("text", "name"), [("EPMeta", PolicyName.EP_META), (" zero3init ", PolicyName.ZERO3_INIT)])
def test_parse_policy_name(text: str, name: PolicyName) -> None:
    assert parse_policy_name(text) is name


def test_parse_policy_name_names_the_accepted_values() -> None:
    with pytest.raises(LoadPolicyError, match=r"'meta'.*accepted: 'Zero3Init', 'MetaShardOnRead', 'EPMeta'"):
        parse_policy_name("meta")


sizes = st.builds(
    ParallelSizes,
    tp=st.sampled_from([1, 2, 4]),
    ep=st.sampled_from([1, 2, 4]),
    fsdp=st.sampled_from([1, 2]),
    pp=st.sampled_from([1, 2]),
    dp_replicate=st.sampled_from([1, 2]),
)
inputs = st.builds(
    LoadInputs,
    zero3_enabled=st.booleans(),
    quantized=st.booleans(),
    outer_zero3_init=st.booleans(),
    sizes=sizes,
    requested=st.none() | st.sampled_from(PolicyName),
)


def _outcome(load_inputs: LoadInputs) -> LoadPolicy | str:
    """The selected policy, or the refusal's message."""
    try:
        return select_load_policy(load_inputs)
    except LoadPolicyError as exc:
        return str(exc)


@given(inputs)
def test_selection_invariants(load_inputs: LoadInputs) -> None:
    outcome = _outcome(load_inputs)
    if isinstance(outcome, str):
        # Every refusal names at least one offending input as `name=value`.
        assert "=" in outcome
        return
    policy = outcome
    table = decision_table(policy)
    assert set(table) == {
        "init_context",
        "nested_from_config_opens_zero3_init",
        "device_map",
        "loading_branch",
        "missing_keys",
        "weight_init",
        "dense_weights",
        "after_loading",
        "saving_branch",
    }
    assert load_inputs.requested in (None, policy.name)
    # zero.Init only with a ZeRO-3 config, never for a quantized model, never with EP (it would partition experts).
    if isinstance(policy, Zero3Init):
        assert load_inputs.zero3_enabled
        assert not load_inputs.quantized
        assert not load_inputs.sizes.expert_parallel
    # EPMeta exactly when EP runs under ZeRO-3.
    assert isinstance(policy, EPMeta) == (load_inputs.zero3_enabled and load_inputs.sizes.expert_parallel)
    # Under ZeRO-3 a device_map is refused unless EP's mesh bound it; without ZeRO-3 nothing changes.
    if load_inputs.zero3_enabled:
        assert policy.device_map in (DeviceMapRule.REFUSE, DeviceMapRule.ADMIT_MESH_BOUND)
        # ZeRO-3 owns data parallelism: FSDP2's dimensions are admitted only as EP's, never both at once, never TP
        sizes = load_inputs.sizes
        assert sizes.fsdp == 1 or (isinstance(policy, EPMeta) and sizes.tp == 1 and sizes.dp_replicate == 1)
        assert sizes.dp_replicate == 1 or (isinstance(policy, EPMeta) and sizes.fsdp == 1)
    else:
        assert policy.device_map is DeviceMapRule.PASS_THROUGH
    # The ZeRO-3 loader, its buffer skip and gathered init always travel together with zero.Init.
    zero3_path = policy.loading_branch is LoadingBranch.ZERO3_GATHER_AND_COPY
    assert zero3_path == (policy.missing_keys is MissingKeys.LEAVE_TO_ZERO3)
    assert zero3_path == (policy.weight_init is WeightInit.GATHERED)
    assert zero3_path == (policy.init_context in (InitContext.ZERO3_INIT, InitContext.OUTER_ZERO3_INIT))
    # Only EPMeta leaves dense weights to ZeRO-3 and hands expert shards to DeepSpeed, and it always does both.
    handed = policy.after_loading is AfterLoading.DEEPSPEED_EXPERT_GROUPS
    assert handed == isinstance(policy, EPMeta) == (policy.dense_weights is DenseWeights.LEFT_TO_ZERO3)
    # A save writes partitions exactly where the load read them: both need ZeRO-3's flat partition layout.
    writes = policy.saving_branch is SavingBranch.ZERO3_WRITE_PARTITIONS
    assert writes == (policy.loading_branch is LoadingBranch.ZERO3_READ_PARTITIONS)


# What a launch's environment says that the selector must not read: it decides from its inputs alone
_LAUNCH_ENVIRONMENTS = [
    {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1"},
    {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"},
    {"WORLD_SIZE": "1", "ACCELERATE_USE_FSDP": "true"},
]


@given(inputs, st.sampled_from(_LAUNCH_ENVIRONMENTS))
def test_selection_reads_only_its_inputs(load_inputs: LoadInputs, environment: dict[str, str]) -> None:
    """The same inputs, rebuilt field by field, select the same policy (or refusal) whatever the environment says."""
    before = _outcome(load_inputs)
    rebuilt = dataclasses.replace(load_inputs, sizes=dataclasses.replace(load_inputs.sizes))
    with mock.patch.dict(os.environ, environment):
        assert _outcome(rebuilt) == before


def test_ranks_that_agree_pass() -> None:
    inputs = LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=2, ep=2))
    check_ranks_agree([inputs_as_dict(inputs)] * 4)


def test_rank_disagreement_names_the_ranks_and_inputs() -> None:
    seen = LoadInputs(zero3_enabled=True, sizes=ParallelSizes(tp=2, ep=2))
    late = LoadInputs(zero3_enabled=False, sizes=ParallelSizes(tp=2, ep=2))
    with pytest.raises(LoadPolicyError) as excinfo:
        check_ranks_agree([inputs_as_dict(seen), inputs_as_dict(late), inputs_as_dict(seen)])
    message = str(excinfo.value)
    assert "zero3_enabled: rank 0=True, rank 1=False, rank 2=True" in message
    assert "ep_size" not in message
    assert "Accelerator" in message
