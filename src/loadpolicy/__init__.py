"""loadpolicy: one typed decision for how transformers loads a model under DeepSpeed ZeRO-3 and expert parallelism."""

from loadpolicy.policy import (
    EPMeta,
    LoadInputs,
    LoadPolicy,
    LoadPolicyError,
    MetaShardOnRead,
    ParallelSizes,
    PolicyName,
    Zero3Init,
    select_load_policy,
)


__all__ = [
    "EPMeta",
    "LoadInputs",
    "LoadPolicy",
    "LoadPolicyError",
    "MetaShardOnRead",
    "ParallelSizes",
    "PolicyName",
    "Zero3Init",
    "select_load_policy",
]
