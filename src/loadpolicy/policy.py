"""Loading policies: one value that owns every ZeRO-3-sensitive decision `from_pretrained` makes.

In transformers 5.23.0 six places inside `from_pretrained` branch on the global `is_deepspeed_zero3_enabled()`.
Expert parallelism (EP) under ZeRO-3 needs the other branch at every one of them, so a single flag cannot describe
it. Instead, `select_load_policy` picks one of three variants from explicit inputs, once, and every gate asks that
value:

| decision (gate)                 | Zero3Init             | MetaShardOnRead               | EPMeta           |
|---------------------------------|-----------------------|-------------------------------|------------------|
| 1  init context                 | zero.Init (or outer)  | meta (quantized: meta+state)  | meta             |
| 1b nested `_from_config` init   | no own zero.Init      | no own zero.Init              | no own zero.Init |
| 2  `device_map`                 | refuse                | refuse under ZeRO-3, else pass| admit mesh-bound |
| 3  loading branch               | read own partitions * | shard on read                 | read partitions *|
| 4  buffers and missing keys     | leave to ZeRO-3       | materialize                   | leave to ZeRO-3 *|
| 5  weight initialization        | gathered              | plain                         | gathered *       |
| 6  dense weights                | (no TP under ZeRO-3)  | as the TP plan says           | left to ZeRO-3   |
| 7  after loading                | as loaded             | as loaded                     | expert groups    |

* Zero3Init: ZeRO-3 gather-and-copy when an outer `zero.Init` built the model or DeepSpeed keeps partitions another way
(hpZ, NVMe parameter offload, quantized weights), and for a state dict or `.bin` files. EPMeta: the model is built on
meta and partitioned before reading (dense weights over the world, expert shards over their expert data-parallel
group); where partitions cannot be read, shard on read, materialize and initialize plainly, dense weights read whole.

This module is the single source of truth for that table. transformers carries a generated copy of it, so it imports
only the standard library and runs on transformers' minimum Python.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, assert_never


__all__ = [
    "AfterLoading",
    "DenseWeights",
    "DeviceMapRule",
    "EPMeta",
    "InitContext",
    "LoadInputs",
    "LoadPolicy",
    "LoadPolicyError",
    "LoadingBranch",
    "MetaShardOnRead",
    "MissingKeys",
    "ParallelSizes",
    "PolicyName",
    "SavingBranch",
    "WeightInit",
    "Zero3Init",
    "check_ranks_agree",
    "decision_table",
    "explain_selection",
    "inputs_as_dict",
    "parse_policy_name",
    "select_load_policy",
]


class LoadPolicyError(ValueError):
    """An impossible combination of loading inputs. The message names the offending values and the accepted ones."""


class PolicyName(enum.StrEnum):
    ZERO3_INIT = "Zero3Init"
    META_SHARD_ON_READ = "MetaShardOnRead"
    EP_META = "EPMeta"


def parse_policy_name(value: str) -> PolicyName:
    """Parse a user's explicit policy choice, case-insensitively."""
    for name in PolicyName:
        if value.strip().lower() == name.value.lower():
            return name
    accepted = ", ".join(repr(name.value) for name in PolicyName)
    raise LoadPolicyError(f"Unknown load policy {value!r}; accepted: {accepted}.")


class InitContext(enum.Enum):
    """Gate 1: what `get_init_context` adds around the model's `__init__`."""

    # no_init_weights + prevent_arange_dtype_change + deepspeed.zero.Init + set_zero3_state
    ZERO3_INIT = "zero3_init"
    # nothing: the model is built inside a `zero.Init` the caller already opened
    OUTER_ZERO3_INIT = "outer_zero3_init"
    # torch.device("meta") + meta_device_safe_creation_ops
    META = "meta"
    # torch.device("meta") + set_quantized_state (ZeRO-3 with a quantized model)
    META_QUANTIZED = "meta_quantized"


class DeviceMapRule(enum.Enum):
    """Gate 2: what `from_pretrained` does with a `device_map`."""

    # any device_map raises: ZeRO-3 places parameters itself
    REFUSE = "refuse"
    # only the single-device `{"": local_device}` bound by the distributed mesh is accepted, and kept
    ADMIT_MESH_BOUND = "admit_mesh_bound"
    # the device_map is used as given
    PASS_THROUGH = "pass_through"


class LoadingBranch(enum.Enum):
    """Gate 3: which loader copies the checkpoint into the model."""

    # `_load_state_dict_into_zero3_model`: rank 0 reads everything, gathers each module, copies
    ZERO3_GATHER_AND_COPY = "zero3_gather_and_copy"
    # `load_zero3_partitions`: every rank reads from the safetensors files only its ZeRO-3 partition of each parameter
    ZERO3_READ_PARTITIONS = "zero3_read_partitions"
    # `convert_and_load_state_dict_in_model`: every rank converts and shards each tensor it owns on read
    SHARD_ON_READ = "shard_on_read"


class MissingKeys(enum.Enum):
    """Gate 4: non-persistent buffers and missing keys left on meta after loading."""

    # early return: ZeRO-3 owns the partitioned parameters
    LEAVE_TO_ZERO3 = "leave_to_zero3"
    # move them from meta to the target device (and DTensor local placeholders)
    MATERIALIZE = "materialize"


class WeightInit(enum.Enum):
    """Gate 5: how weights missing from the checkpoint are initialized."""

    # `GatheredParameters(..., modifier_rank=0)` around `initialize_weights()`
    GATHERED = "gathered"
    # `initialize_weights()` on the local tensors
    PLAIN = "plain"


class DenseWeights(enum.Enum):
    """Gate 6: who shards the dense (non-expert) weights of a model loaded with a `DistributedConfig`."""

    # the TP plan, at load time (dense weights stay whole where it has no rule)
    AS_PLANNED = "as_planned"
    # nobody at load time: every rank reads them whole and ZeRO-3 partitions them when DeepSpeed wraps the model
    LEFT_TO_ZERO3 = "left_to_zero3"


class AfterLoading(enum.Enum):
    """Gate 7: what `from_pretrained` hands over once the weights are in."""

    # the model as loaded
    AS_LOADED = "as_loaded"
    # expert shards as plain local parameters in DeepSpeed's expert groups, DeepSpeed owning data parallelism
    DEEPSPEED_EXPERT_GROUPS = "deepspeed_expert_groups"


class SavingBranch(enum.Enum):
    """Gate 8: how `save_pretrained` writes the weights (the same partitions the loader read, or gathered whole)."""

    # every parameter gathered whole to the writing rank, which writes the files
    GATHER_TO_WRITER = "gather_to_writer"
    # every rank writes its own ZeRO-3 partition of each parameter into the safetensors files: nothing gathered
    ZERO3_WRITE_PARTITIONS = "zero3_write_partitions"


@dataclass(frozen=True, slots=True)
class Zero3Init:
    """Dense ZeRO-3: build on meta where every rank reads its partitions, else under `zero.Init`; rank 0 copies all."""

    # True when an outer `zero.Init` (transformers' `_is_ds_init_called`) is already active around this build.
    under_outer_init: bool = False
    # True when every rank reads its own partition of each parameter; False: gather each module and copy on rank 0.
    reads_partitions: bool = False

    name: ClassVar[PolicyName] = PolicyName.ZERO3_INIT
    # the parent's zero.Init already covers it, or the parent is on meta
    nested_from_config_opens_zero3_init: ClassVar[bool] = False
    device_map: ClassVar[DeviceMapRule] = DeviceMapRule.REFUSE
    missing_keys: ClassVar[MissingKeys] = MissingKeys.LEAVE_TO_ZERO3
    weight_init: ClassVar[WeightInit] = WeightInit.GATHERED
    dense_weights: ClassVar[DenseWeights] = DenseWeights.AS_PLANNED  # tp_size > 1 without EP is refused under ZeRO-3
    after_loading: ClassVar[AfterLoading] = AfterLoading.AS_LOADED

    @property
    def init_context(self) -> InitContext:
        if self.under_outer_init:
            return InitContext.OUTER_ZERO3_INIT
        # partitions that are read need no whole module first: they are made on the meta device, as EP's are
        return InitContext.META if self.reads_partitions else InitContext.ZERO3_INIT

    @property
    def loading_branch(self) -> LoadingBranch:
        return LoadingBranch.ZERO3_READ_PARTITIONS if self.reads_partitions else LoadingBranch.ZERO3_GATHER_AND_COPY

    @property
    def saving_branch(self) -> SavingBranch:
        # the partitions the loader could read by range can be written by range
        return SavingBranch.ZERO3_WRITE_PARTITIONS if self.reads_partitions else SavingBranch.GATHER_TO_WRITER


@dataclass(frozen=True, slots=True)
class MetaShardOnRead:
    """The standard path: build on meta, each rank converts and shards what it owns while reading."""

    zero3_enabled: bool = False
    quantized: bool = False

    name: ClassVar[PolicyName] = PolicyName.META_SHARD_ON_READ
    nested_from_config_opens_zero3_init: ClassVar[bool] = False  # sub-models are built on the parent's meta device
    loading_branch: ClassVar[LoadingBranch] = LoadingBranch.SHARD_ON_READ
    missing_keys: ClassVar[MissingKeys] = MissingKeys.MATERIALIZE
    weight_init: ClassVar[WeightInit] = WeightInit.PLAIN
    dense_weights: ClassVar[DenseWeights] = DenseWeights.AS_PLANNED
    after_loading: ClassVar[AfterLoading] = AfterLoading.AS_LOADED
    saving_branch: ClassVar[SavingBranch] = SavingBranch.GATHER_TO_WRITER

    @property
    def init_context(self) -> InitContext:
        # Stock transformers marks the quantized build (`set_quantized_state`) only under ZeRO-3.
        return InitContext.META_QUANTIZED if self.zero3_enabled and self.quantized else InitContext.META

    @property
    def device_map(self) -> DeviceMapRule:
        return DeviceMapRule.REFUSE if self.zero3_enabled else DeviceMapRule.PASS_THROUGH


@dataclass(frozen=True, slots=True)
class EPMeta:
    """Expert parallelism under ZeRO-3: the standard path at every gate, experts sharded on read by EP rank."""

    ep_size: int
    # True when every rank reads its partitions: the model built on meta is partitioned before reading (dense weights
    # over the data-parallel world, expert shards over their expert data-parallel group); False: dense weights whole
    reads_partitions: bool = False

    name: ClassVar[PolicyName] = PolicyName.EP_META
    init_context: ClassVar[InitContext] = InitContext.META
    nested_from_config_opens_zero3_init: ClassVar[bool] = False  # a nested zero.Init would partition experts to (0,)
    device_map: ClassVar[DeviceMapRule] = DeviceMapRule.ADMIT_MESH_BOUND
    # TP-sharded dense weights would be DTensors DeepSpeed cannot wrap, and ZeRO-3 partitions them anyway.
    dense_weights: ClassVar[DenseWeights] = DenseWeights.LEFT_TO_ZERO3
    # DeepSpeed must neither broadcast the expert shards from rank 0 nor partition them across EP ranks.
    after_loading: ClassVar[AfterLoading] = AfterLoading.DEEPSPEED_EXPERT_GROUPS

    @property
    def loading_branch(self) -> LoadingBranch:
        return LoadingBranch.ZERO3_READ_PARTITIONS if self.reads_partitions else LoadingBranch.SHARD_ON_READ

    @property
    def missing_keys(self) -> MissingKeys:
        # read partitions are ZeRO-3 parameters, as under Zero3Init
        return MissingKeys.LEAVE_TO_ZERO3 if self.reads_partitions else MissingKeys.MATERIALIZE

    @property
    def weight_init(self) -> WeightInit:
        return WeightInit.GATHERED if self.reads_partitions else WeightInit.PLAIN

    @property
    def saving_branch(self) -> SavingBranch:
        return SavingBranch.ZERO3_WRITE_PARTITIONS if self.reads_partitions else SavingBranch.GATHER_TO_WRITER


LoadPolicy = Zero3Init | MetaShardOnRead | EPMeta


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LoadPolicyError(f"`{name}` must be an integer >= 1, got {value!r}.")
    return value


@dataclass(frozen=True, slots=True)
class ParallelSizes:
    """Distributed sizes after `DistributedConfig` normalization (all 1 when there is no distributed config)."""

    tp: int = 1
    ep: int = 1
    fsdp: int = 1
    pp: int = 1
    dp_replicate: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "fsdp", "pp", "dp_replicate"):
            _check_size(f"{name}_size", getattr(self, name))

    @property
    def dp(self) -> int:
        """Ranks that see distinct batches; transformers applies FSDP2 when this is above 1."""
        return self.dp_replicate * self.fsdp

    @property
    def expert_parallel(self) -> bool:
        """EP is on when `ep_size > 1` after normalization, whatever `enable_expert_parallel` said."""
        return self.ep > 1

    def describe(self) -> str:
        return (
            f"tp_size={self.tp}, ep_size={self.ep}, fsdp_size={self.fsdp}, pp_size={self.pp}, "
            f"dp_replicate_size={self.dp_replicate}"
        )


@dataclass(frozen=True, slots=True)
class LoadInputs:
    """Everything the selection depends on, gathered by the caller: the selector reads no global state."""

    zero3_enabled: bool
    quantized: bool = False
    # transformers' `_is_ds_init_called`: this build happens inside a `zero.Init` somebody else opened
    outer_zero3_init: bool = False
    # ZeRO-3 keeps each rank's share of a parameter as one flat slice in `ds_tensor`: no hpZ secondary partition, NVMe
    # parameter offload or quantized non-trainable weights (transformers' `zero3_keeps_flat_partitions`)
    zero3_flat_partitions: bool = False
    sizes: ParallelSizes = ParallelSizes()
    requested: PolicyName | None = None


def select_load_policy(inputs: LoadInputs) -> LoadPolicy:
    """Select the loading policy for `inputs`, or raise `LoadPolicyError` for an impossible combination."""
    return explain_selection(inputs)[0]


def explain_selection(inputs: LoadInputs) -> tuple[LoadPolicy, str]:
    """`select_load_policy`, with a one-line reason for the choice."""
    _refuse_impossible(inputs)
    sizes = inputs.sizes
    default: LoadPolicy
    if not inputs.zero3_enabled:
        default, reason = MetaShardOnRead(quantized=inputs.quantized), "no ZeRO-3 config is active"
    elif sizes.expert_parallel:
        # the model is built on meta here, so no outer zero.Init (refused above) stands in the way of reading
        default = EPMeta(ep_size=sizes.ep, reads_partitions=inputs.zero3_flat_partitions)
        reason = f"EP (ep_size={sizes.ep}) under ZeRO-3 must shard experts on read"
        if inputs.zero3_flat_partitions:
            reason += "; every rank reads its partitions of the dense weights and of its experts"
        if sizes.dp_replicate > 1:
            reason += f"; ZeRO-3 owns the {sizes.dp_replicate} data-parallel replicas"
        if sizes.fsdp > 1:
            reason += f"; ZeRO-3 owns the {sizes.fsdp} data-parallel ranks, tokens reach their experts by all-to-all"
    elif inputs.quantized:
        default = MetaShardOnRead(zero3_enabled=True, quantized=True)
        reason = "a quantized model cannot be built under zero.Init"
    else:
        default, reason = _dense_zero3(inputs)

    match inputs.requested:
        case None:
            return default, reason
        case PolicyName.META_SHARD_ON_READ if isinstance(default, Zero3Init) and not default.under_outer_init:
            # The one explicit override that changes the outcome: dense ZeRO-3 loaded through shard-on-read.
            return MetaShardOnRead(zero3_enabled=True), "requested explicitly for dense ZeRO-3"
        case requested if requested is default.name:
            return default, f"requested explicitly; {reason}"
        case requested:
            raise LoadPolicyError(
                f"Load policy {requested.value!r} was requested, but {_describe(inputs)} selects "
                f"{default.name.value!r} ({reason}); accepted choices here: {_accepted(inputs, default)}."
            )


def _dense_zero3(inputs: LoadInputs) -> tuple[Zero3Init, str]:
    """Dense ZeRO-3: which loader fills the partitions `zero.Init` built."""
    if inputs.outer_zero3_init:
        # The outer zero.Init may partition with a config the selector does not see: gather and copy
        return Zero3Init(under_outer_init=True), "an outer zero.Init is already active"
    if inputs.zero3_flat_partitions:
        reason = "dense ZeRO-3 partitions the model on the meta device; every rank reads its own partitions"
        return Zero3Init(reads_partitions=True), reason
    return Zero3Init(), (
        "dense ZeRO-3 partitions parameters while the model is built; DeepSpeed keeps partitions in a layout "
        "partition reads do not write (hpZ, NVMe parameter offload or quantized weights): gather and copy"
    )


def _describe(inputs: LoadInputs) -> str:
    return (
        f"zero3_enabled={inputs.zero3_enabled}, quantized={inputs.quantized}, "
        f"outer_zero3_init={inputs.outer_zero3_init}, zero3_flat_partitions={inputs.zero3_flat_partitions}, "
        f"{inputs.sizes.describe()}"
    )


def _accepted(inputs: LoadInputs, default: LoadPolicy) -> str:
    choices = [default.name]
    if isinstance(default, Zero3Init) and not default.under_outer_init:
        choices.append(PolicyName.META_SHARD_ON_READ)
    return ", ".join(repr(name.value) for name in choices) + " (or no explicit choice)"


def _refuse_impossible(inputs: LoadInputs) -> None:
    """Refuse combinations no policy can load correctly, before anything is built or any collective runs."""
    sizes = inputs.sizes
    if not inputs.zero3_enabled:
        return
    # FSDP2 never runs under ZeRO-3. With EP, ZeRO-3 owns the data-parallel dimension of the mesh instead: the
    # dp_replicate replicas of tp = ep groups (world = dp x ep), or, with token dispatch, the fsdp ranks (every rank
    # its own batch, world = fsdp = efsdp x ep).
    token_dispatch = sizes.expert_parallel and sizes.tp == 1 and sizes.dp_replicate == 1
    if (sizes.fsdp > 1 and not token_dispatch) or (sizes.dp_replicate > 1 and not sizes.expert_parallel):
        raise LoadPolicyError(
            f"DeepSpeed ZeRO-3 cannot be combined with FSDP2 data parallelism (fsdp_size={sizes.fsdp}, "
            f"dp_replicate_size={sizes.dp_replicate}, tp_size={sizes.tp}, ep_size={sizes.ep}): both would shard the "
            "same parameters. Accepted under ZeRO-3: fsdp_size=1 and dp_replicate_size=1; with expert parallelism, "
            "DistributedConfig(fsdp_size=<world size>, ep_size=E) (every rank its own batch, tokens sent to their "
            "experts by all-to-all, ZeRO-3 owning the fsdp ranks) or DistributedConfig(tp_size=E, ep_size=E, "
            "dp_replicate_size=<world size / E>); or drop the DeepSpeed config."
        )
    if sizes.pp > 1:
        raise LoadPolicyError(
            f"DeepSpeed ZeRO-3 cannot be combined with pipeline parallelism (pp_size={sizes.pp}). "
            "Accepted under ZeRO-3: pp_size=1."
        )
    if sizes.expert_parallel and inputs.quantized:
        raise LoadPolicyError(
            f"Expert parallelism (ep_size={sizes.ep}) under ZeRO-3 is not supported for quantized models. "
            "Accepted: ep_size=1 for a quantized model under ZeRO-3, or a model that is not quantized."
        )
    if sizes.expert_parallel and inputs.outer_zero3_init:
        raise LoadPolicyError(
            f"Expert parallelism (ep_size={sizes.ep}) cannot load inside an outer deepspeed.zero.Init: it would "
            "partition the experts before EP shards them. Accepted: call from_pretrained outside zero.Init, "
            "or ep_size=1."
        )
    if sizes.tp > 1 and not sizes.expert_parallel:
        raise LoadPolicyError(
            f"Tensor parallelism without expert parallelism (tp_size={sizes.tp}, ep_size={sizes.ep}) is not "
            "supported under ZeRO-3. Accepted under ZeRO-3: tp_size=1, or ep_size > 1 for an MoE model."
        )


def inputs_as_dict(inputs: LoadInputs) -> dict[str, object]:
    """The selection inputs as plain JSON values, for comparing them across ranks."""
    sizes = inputs.sizes
    return {
        "zero3_enabled": inputs.zero3_enabled,
        "quantized": inputs.quantized,
        "outer_zero3_init": inputs.outer_zero3_init,
        "zero3_flat_partitions": inputs.zero3_flat_partitions,
        "tp_size": sizes.tp,
        "ep_size": sizes.ep,
        "fsdp_size": sizes.fsdp,
        "pp_size": sizes.pp,
        "dp_replicate_size": sizes.dp_replicate,
        "requested": None if inputs.requested is None else inputs.requested.value,
    }


def check_ranks_agree(per_rank: list[dict[str, object]]) -> None:
    """Raise `LoadPolicyError` naming each input that differs between ranks, with every rank's value.

    Ranks that select from different inputs load differently (one builds under zero.Init, another on meta) and then
    wait for each other in collectives that never match. A typical cause: `Accelerator()`, `TrainingArguments` or
    `HfDeepSpeedConfig` created after `from_pretrained` on some ranks, so only the others see the ZeRO-3 config.
    """
    keys = sorted({key for values in per_rank for key in values})
    differing = [key for key in keys if len({repr(values.get(key)) for values in per_rank}) > 1]
    if not differing:
        return
    details = "; ".join(
        f"{key}: " + ", ".join(f"rank {rank}={values.get(key)!r}" for rank, values in enumerate(per_rank))
        for key in differing
    )
    raise LoadPolicyError(
        f"Ranks disagree on how to load ({details}). Every rank must see the same DeepSpeed and distributed "
        "configuration before `from_pretrained`: create the `Accelerator`, `TrainingArguments` or `HfDeepSpeedConfig` "
        "on every rank first, and pass the same `distributed_config` everywhere."
    )


def decision_table(policy: LoadPolicy) -> dict[str, enum.Enum | bool]:
    """Every decision of `policy`, keyed by the gate it answers (the order in which `from_pretrained` asks)."""
    match policy:
        case Zero3Init() | MetaShardOnRead() | EPMeta():
            return {
                "init_context": policy.init_context,
                "nested_from_config_opens_zero3_init": policy.nested_from_config_opens_zero3_init,
                "device_map": policy.device_map,
                "loading_branch": policy.loading_branch,
                "missing_keys": policy.missing_keys,
                "weight_init": policy.weight_init,
                "dense_weights": policy.dense_weights,
                "after_loading": policy.after_loading,
                "saving_branch": policy.saving_branch,
            }
        case _:
            assert_never(policy)
