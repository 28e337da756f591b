"""The save benchmark's ways of writing a loaded ZeRO-3 model, and the launch each model is loaded with."""

from __future__ import annotations

import enum

from loadpolicy.shape import LaunchShape
from loadpolicy_lab.models.bench import BenchModel


class Way(enum.StrEnum):
    # `save_pretrained` on every rank: each writes its own partitions (the patched tree's saving branch)
    PARTITIONS = "partitions"
    # every parameter gathered to rank 0, which writes the files (`save_pretrained(state_dict=...)`)
    GATHERED = "gathered"
    # DeepSpeed's own 16-bit consolidation (`engine.save_16bit_model`): DeepSpeed's names, one file
    DEEPSPEED_16BIT = "deepspeed_16bit"
    # each rank writes as many bytes as its partitions hold with plain `pwrite`, then `fsync`: the physical limit
    WRITE_LIMIT = "write_limit"

    @property
    def value_checked(self) -> bool:
        """Whether the files are compared with the checkpoint: DeepSpeed's are in its own layout (merged experts,
        and under EP one rank's shard under the full tensor's name), the limit writes no checkpoint."""
        return self in (Way.PARTITIONS, Way.GATHERED)


def shape(model: BenchModel, ranks: int) -> LaunchShape:
    """MoE models load with EP over every rank (EPMeta), dense ones with dense ZeRO-3 (Zero3Init); both read and write
    partitions on the patched tree."""
    if model.moe:
        return LaunchShape.experts_over(ranks, ranks, zero3=True)
    return LaunchShape(ranks, zero3=True)
