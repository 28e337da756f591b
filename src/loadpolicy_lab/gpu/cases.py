"""The GPU check's cases: each load-save-train case at its world size and device, and the read benchmark."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    TRAIN = "load, save, train"  # load, placement, save by partition writes, 3 steps against one device, save
    READ = "read"  # one rank's share of a checkpoint: partition reads against preadv + copy and the copy alone


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    what: str
    ranks: int
    gpus: int  # GPUs the case needs
    device: str  # LOADPOLICY_DEVICE of its launch: "cuda" (a GPU per rank, nccl) or "cuda-shared" (cuda:0, gloo)
    kind: Kind = Kind.TRAIN
    ep: bool = False  # EPMeta: token dispatch, DistributedConfig(fsdp_size=W, ep_size=W)
    offload: bool = False  # ZeRO-3 offload_param to the CPU: partitions on the host, gathered onto the GPU


# The model holds a routing bias buffer (DeepSeek-V3's e_score_correction_bias), which must sit on the GPU
MODEL_TYPE = "deepseek_v3"
STEPS = 3

CASES = (
    Case("dense-w1", "dense ZeRO-3, partition reads and writes, W = 1 on nccl", 1, 1, "cuda"),
    Case(
        "dense-offload-w1",
        "dense ZeRO-3 with parameters offloaded to the CPU, W = 1 on nccl",
        1,
        1,
        "cuda",
        offload=True,
    ),
    Case("epmeta-w2-shared", "EPMeta, token dispatch, W = 2 on gloo sharing cuda:0", 2, 1, "cuda-shared", ep=True),
    Case("epmeta-w4-shared", "EPMeta, token dispatch, W = 4 on gloo sharing cuda:0", 4, 1, "cuda-shared", ep=True),
    Case(
        "dense-offload-w2-shared",
        "dense ZeRO-3 offloaded to the CPU, W = 2 on gloo sharing cuda:0 (gathers onto the GPU)",
        2,
        1,
        "cuda-shared",
        offload=True,
    ),
    Case("epmeta-w2", "EPMeta, token dispatch, W = 2 on nccl, a GPU per rank", 2, 2, "cuda", ep=True),
    Case("dense-offload-w2", "dense ZeRO-3 offloaded to the CPU, W = 2 on nccl", 2, 2, "cuda", offload=True),
    Case(
        "read",
        "one rank's share of a published width: partition reads vs preadv + copy vs the copy",
        1,
        1,
        "cuda",
        Kind.READ,
    ),
)
CASES_BY_NAME = {case.name: case for case in CASES}
