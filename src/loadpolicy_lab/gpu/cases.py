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
    ranks: int
    gpus: int  # GPUs the case needs
    device: str  # LOADPOLICY_DEVICE of its launch: "cuda" (a GPU per rank, nccl) or "cuda-shared" (cuda:0, gloo)
    kind: Kind = Kind.TRAIN
    ep: bool = False  # EPMeta: token dispatch, DistributedConfig(fsdp_size=W, ep_size=W)
    offload: bool = False  # ZeRO-3 offload_param to the CPU: partitions on the host, gathered onto the GPU

    @property
    def what(self) -> str:
        """The case in words, from its fields."""
        if self.kind is Kind.READ:
            return "one rank's share of a published width: partition reads vs preadv + copy vs the copy"
        load = "EPMeta, token dispatch" if self.ep else "dense ZeRO-3"
        load += " offloaded to the CPU" if self.offload else ", partition reads and writes" * (not self.ep)
        if self.device == "cuda-shared":
            return f"{load}, W = {self.ranks} on gloo sharing cuda:0" + " (gathers onto the GPU)" * self.offload
        return f"{load}, W = {self.ranks} on nccl" + ", a GPU per rank" * (self.ep and self.ranks > 1)


# The model holds a routing bias buffer (DeepSeek-V3's e_score_correction_bias), which must sit on the GPU
MODEL_TYPE = "deepseek_v3"
STEPS = 3

CASES = (
    Case("dense-w1", 1, 1, "cuda"),
    Case("dense-offload-w1", 1, 1, "cuda", offload=True),
    Case("epmeta-w2-shared", 2, 1, "cuda-shared", ep=True),
    Case("epmeta-w4-shared", 4, 1, "cuda-shared", ep=True),
    Case("dense-offload-w2-shared", 2, 1, "cuda-shared", offload=True),
    Case("epmeta-w2", 2, 2, "cuda", ep=True),
    Case("dense-offload-w2", 2, 2, "cuda", offload=True),
    Case("read", 1, 1, "cuda", Kind.READ),
)
CASES_BY_NAME = {case.name: case for case in CASES}
