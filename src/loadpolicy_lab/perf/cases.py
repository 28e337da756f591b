"""The performance suite's cases: each way of loading (`Case`: the policy and loading branch its ranks must report,
and what makes a launch not that case); the ways a real-width checkpoint is read without transformers (`Reader`: the
cold-read limits and the peer readers); and the ways a loaded model is saved (`SaveWay`). `CASES` are the
benchmark's loads at its sizes, `LOADS` the loads of a real-width run."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.policy import LoadingBranch, PolicyName
from loadpolicy.shape import EPLayout, LaunchShape
from loadpolicy_lab.harness.launch import Tree
from loadpolicy_lab.models.bench import BenchModel
from loadpolicy_lab.perf.contract import BenchSpec


@dataclass(frozen=True, slots=True)
class Case:
    """One way of loading: which policy the ranks must report, and the inputs that select it."""

    label: str
    policy: PolicyName
    zero3: bool
    layout: EPLayout = EPLayout.NONE
    requested: PolicyName | None = None
    moe_only: bool = False
    dense_only: bool = False
    # stock 5.23.0 for what stock does: the patched tree's loads add store exchanges (agreement, fail-together)
    tree: Tree = Tree.PATCHED
    # the loader every rank must report, where the policy has more than one
    branch: LoadingBranch | None = None
    # DeepSpeed AutoEP: a stock `zero.Init` load whose experts `deepspeed.initialize` regroups over the ranks
    autoep: bool = False

    def shape(self, ranks: int) -> LaunchShape:
        """EP over every rank (`DistributedConfig(tp_size=R, ep_size=R)`) where the case uses EP."""
        stock = self.tree is Tree.STOCK  # stock transformers gathers and copies
        return LaunchShape(ranks, self.zero3, self.layout, requested=self.requested, flat_partitions=not stock)

    def spec(
        self, ranks: int, checkpoint: Path, model_class: str, fingerprints: Path, logits: Path | None = None
    ) -> BenchSpec:
        """What every rank of this case's load of `checkpoint` is handed; `logits`: judge its forward too."""
        return {
            "policy": self.policy,
            "zero3": self.zero3,
            "distributed": self.shape(ranks).distributed_config(),
            "requested": self.requested,
            "checkpoint": str(checkpoint),
            "model_class": model_class,
            "fingerprints": str(fingerprints),
            "logits": None if logits is None else str(logits),
            "autoep": self.autoep,
        }


_MSOR, _EP = PolicyName.META_SHARD_ON_READ, EPLayout.TP_EQUALS_EP
CASES = (
    Case("Zero3Init (stock)", PolicyName.ZERO3_INIT, zero3=True, tree=Tree.STOCK),
    Case("Zero3Init: partition reads", PolicyName.ZERO3_INIT, zero3=True, branch=LoadingBranch.ZERO3_READ_PARTITIONS),
    Case("MetaShardOnRead: plain EP", _MSOR, zero3=False, layout=_EP, moe_only=True),
    Case("MetaShardOnRead: dense ZeRO-3", _MSOR, zero3=True, requested=_MSOR, dense_only=True),
    Case(
        "EPMeta: partition reads",
        PolicyName.EP_META,
        zero3=True,
        layout=_EP,
        moe_only=True,
        branch=LoadingBranch.ZERO3_READ_PARTITIONS,
    ),
)


class Reader(enum.StrEnum):
    """A launch that reads the checkpoint without transformers (`perf.reader_worker`)."""

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
    # Run:ai Model Streamer (`SafetensorsStreamer`, its default concurrency and memory limit, owned tensors): it reads
    # whole tensors only, so each rank streams whole the tensors `ranges.whole_owners` gives it (the experts where EP
    # puts them, the rest balanced by bytes): about the bytes of a partition load, in another cut
    RUNAI = "runai"
    # fastsafetensors (`SafeTensorsFileLoader`, no GDS, its default buffer): it reads whole files, and shares them
    # over ranks by broadcasting (`get_sharded`, which on gloo hangs on a split that does not divide evenly), so each
    # rank reads whole the files `ranges.file_owners` gives it, in a process group of its own: the read alone, every
    # byte once over the ranks, in the cut of its files
    FASTSAFETENSORS = "fastsafetensors"


# the peers `dev perf widths` reads beside the loads, and every way DCP can read (`perf rounds --ways`)
DCP_READERS = (Reader.DCP, Reader.DCP_EXPERTS)
DCP_ANY = (*DCP_READERS, Reader.DCP_4_THREADS, Reader.DCP_8_THREADS)
DCP_THREADS = {Reader.DCP_4_THREADS: 4, Reader.DCP_8_THREADS: 8}
# the readers that hold what they read, each rank's tensors compared with the file's bytes afterwards
HOLDING_READERS = (*DCP_ANY, Reader.RUNAI, Reader.FASTSAFETENSORS)
# the readers that hold tensors whole, each on one rank: a rank compares the tensors it holds, not every tensor
WHOLE_READERS = (Reader.DCP_EXPERTS, Reader.RUNAI, Reader.FASTSAFETENSORS)


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


class SaveWay(enum.StrEnum):
    """The save benchmark's ways of writing a loaded ZeRO-3 model (`save_run`)."""

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
        return self in (SaveWay.PARTITIONS, SaveWay.GATHERED)


def save_shape(model: BenchModel, ranks: int) -> LaunchShape:
    """MoE models load with EP over every rank (EPMeta), dense ones with dense ZeRO-3 (Zero3Init); both read and write
    partitions on the patched tree."""
    if model.moe:
        return LaunchShape.experts_over(ranks, ranks, zero3=True)
    return LaunchShape(ranks, zero3=True)
