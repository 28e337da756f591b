"""The ways a real-width checkpoint is read in one run: the cold-read limit, the transformers loads (the load
benchmark's cases, EPMeta in both EP spellings) and the peer reader."""

from __future__ import annotations

import enum

from loadpolicy.policy import LoadingBranch, PolicyName
from loadpolicy.shape import EPLayout
from loadpolicy_lab.bench.cases import CASES, Case
from loadpolicy_lab.harness.launch import Tree


class Reader(enum.StrEnum):
    """A launch that reads the checkpoint without transformers (`widths.worker`)."""

    # every rank its own share with plain `preadv`: the limit
    PREAD = "pread"
    # the same share, several reads in flight as the patched partition reads keep them: this disk's limit for them
    PREAD_IN_FLIGHT = "pread-in-flight"
    # the same, each chunk read into memory allocated for it and kept until the end, as a load keeps what it reads:
    # the limit for a reader that owns its bytes (here faulting in fresh pages can cost as much as the reads)
    PREAD_KEPT = "pread-kept"
    # torch DCP's HuggingFaceStorageReader into row-sharded DTensors: the peer, in the sharding it is built for
    DCP = "dcp"
    # the same reader into the loads' sharding: each expert's tensors whole on the rank that holds the expert (a plain
    # tensor in that rank's state dict alone), every other tensor row-sharded: the same bytes per rank as the loads
    DCP_EXPERTS = "dcp-experts"
    # the peer in its own sharding with more of its reading threads (`HuggingFaceStorageReader(thread_count=...)`,
    # 1 by default): its best documented setting is the one that reads fastest on the disk at hand
    DCP_4_THREADS = "dcp-4-threads"
    DCP_8_THREADS = "dcp-8-threads"


# the peers `dev widths` reads beside the loads, and every way DCP can read (`widths-rounds --ways`)
DCP_READERS = (Reader.DCP, Reader.DCP_EXPERTS)
DCP_ANY = (*DCP_READERS, Reader.DCP_4_THREADS, Reader.DCP_8_THREADS)
DCP_THREADS = {Reader.DCP_4_THREADS: 4, Reader.DCP_8_THREADS: 8}


_BY_LABEL = {case.label: case for case in CASES}
LOADS: tuple[Case, ...] = (
    _BY_LABEL["Zero3Init (stock)"],
    _BY_LABEL["Zero3Init: partition reads"],
    _BY_LABEL["EPMeta: partition reads"],
    Case(
        "EPMeta: token dispatch",
        PolicyName.EP_META,
        zero3=True,
        layout=EPLayout.TOKEN_DISPATCH,
        moe_only=True,
        branch=LoadingBranch.ZERO3_READ_PARTITIONS,
    ),
    _BY_LABEL["MetaShardOnRead: plain EP"],
    # the peer that trains: stock zero.Init, then AutoEP regroups the experts over the ranks in deepspeed.initialize
    Case("DeepSpeed AutoEP", PolicyName.ZERO3_INIT, zero3=True, tree=Tree.STOCK, moe_only=True, autoep=True),
)


def has_autoep_preset(model_type: str) -> bool:
    """Whether DeepSpeed AutoEP has a preset for the model type (gpt-oss has none in 0.19.8)."""
    from deepspeed.module_inject.auto_ep_presets.registry import PRESET_MODELS  # noqa: PLC0415

    return model_type in PRESET_MODELS


# the loads held to the goals (within 1.5x the limit, peak <= 1.05x (T/W + baseline)): those that read partitions
PARTITION_READS = frozenset(case.label for case in LOADS if case.branch is LoadingBranch.ZERO3_READ_PARTITIONS)
