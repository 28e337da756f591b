"""What a parity rank reports: the contract between `worker` (writes) and `run`/`judges` (read and judge).

Results travel as `torch.save` files; `harness.rank.parse` reads one back as its contract, or as a `RankFailure` (a
missing file, a rank that failed, a field the contract requires that is not there), so a judge never reads a field
that is not there and a missing figure can never count as a pass.
"""

# No `from __future__ import annotations`: TypedDict reads `NotRequired` off evaluated annotations only, and
# `parse` relies on `__required_keys__`.
from typing import NotRequired, TypedDict

from loadpolicy_lab.training.contract import Tensor, TrainingSpec


# where a case's DeepSpeed checkpoint, converted for another topology, lies: under its `checkpoint_dir`
UNIVERSAL_TAG = "universal"


class Export(TypedDict):
    """Saving a Hub checkpoint on this rank: how far its resident memory rose."""

    save_peak_rise_mib: float
    wrote_partitions: bool  # saved through the policy's partition writes, not gathered


class SavedCheckpoint(TypedDict):
    """`engine.save_checkpoint`, a reload into a freshly loaded engine, and one more step on both."""

    loaded: bool
    frozen: list[str]
    restored_equal: bool
    loss_continued: float
    loss_resumed: float
    weights_continued: dict[str, Tensor]
    weights_resumed: dict[str, Tensor]
    # DeepSpeed's offline `zero_to_fp32` on the checkpoint, run by rank 0 alone (other ranks record "" and {}): its
    # error, or the state dict it gave
    zero_to_fp32_error: str
    zero_to_fp32_state: dict[str, Tensor]


class TrainedRank(TypedDict):
    """One rank of a distributed run: what the load handed over, the losses, and the final weights."""

    policy: str
    # the parameters the load handed to DeepSpeed's expert groups, and whether each survived the wrap bit for bit
    experts: list[str]
    # the ranks DeepSpeed partitions those shards over, one list per distinct group (exactly one is right)
    expert_group_ranks: list[list[int]]
    unchanged: dict[str, bool]
    losses: list[float]
    # gathered after training; expert tensors are this rank's shard
    weights: dict[str, Tensor]
    export: NotRequired[Export]
    checkpoint: NotRequired[SavedCheckpoint]


class Reloaded(TypedDict):
    """One process reloading a saved Hub checkpoint with plain `from_pretrained`."""

    weights: dict[str, Tensor]
    loading_info: dict[str, list[str]]
    keys_on_disk: list[str]
    keys_in_checkpoint: list[str]


class ParitySpec(TrainingSpec):
    """What `run` hands every rank of a launch (OUT/spec.json); the one-process reference reads the same: the training
    (`training.contract`) and what the parity cases add to it."""

    mode: str  # single, deepspeed, accelerate, trainer or reload (the worker's docstring)
    checkpoint_dir: str  # "" for none: where `save_checkpoint` writes
    export_dir: str  # "" for none: where the trained model is saved for the Hub
    # every rank but rank 0 saves into `export_dir` + ".rank<R>" instead: directories the other ranks do not see
    export_unshared: bool
    save_steps: int  # 0 for none: the Trainer's checkpoint interval
    resume_from: str  # "" for none: the Trainer checkpoint, or DeepSpeed's Universal Checkpoint, a launch resumes from
    # a PEFT LoRA adapter on the attention projections and on the experts (`target_parameters`), trained instead of
    # the model, every adapter set to the same values as the reference's (an EP rank: its experts' blocks)
    lora: bool
    # the reference is the same recipe under stock dense ZeRO-3 on as many ranks, not one process: TRL turns the MoE
    # load-balancing loss on, computed per micro-batch and scaled by the Trainer with the ranks' token count, which
    # one process on the global batch does not reproduce
    distributed_reference: bool
