"""The training-parity cases: each way users train after loading, at which ranks and EP shape, on which tree.

`PARITY_FAST` is CI's, `PARITY_MAIN` the main job's (`tox -e multigpu`), `PARITY_FULL` the sweep's. How a case runs
and is judged: docs/validation.md.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from loadpolicy.shape import LaunchShape
from loadpolicy_lab.harness.launch import Launcher, Tree


RESUME_AFTER = 2  # steps
# Frozen in the checkpoint cases: a dense matrix, an attention projection and one layer's experts.
FROZEN = ("embed_tokens", "layers.0.self_attn.q_proj", "layers.0.mlp.experts.down_proj")


class Trainer(enum.StrEnum):
    """What trains the model after `from_pretrained`."""

    DEEPSPEED = "deepspeed"  # deepspeed.initialize under torchrun
    ACCELERATE = "accelerate"  # Accelerator().prepare under accelerate launch
    HF_TRAINER = "trainer"  # transformers.Trainer(deepspeed=...) under torchrun
    # TRL's SFTTrainer (a Trainer) under torchrun, as users fine-tune; it turns the MoE load-balancing loss on
    TRL_SFT = "trl"

    @property
    def steps(self) -> int:
        return 5 if self is Trainer.DEEPSPEED else 3

    @property
    def launcher(self) -> Launcher:
        return Launcher.ACCELERATE if self is Trainer.ACCELERATE else Launcher.TORCHRUN


@dataclass(frozen=True, slots=True)
class ParityCase:
    arch: str
    ranks: int
    trainer: Trainer
    clip: float = 1.0
    checkpoint: bool = False  # save_checkpoint and reload, with FROZEN parameters frozen
    tree: Tree = Tree.PATCHED
    # "adamw" (what users train with) or "sgd": Adam is nearly invariant to a gradient's scale, SGD is not, so only
    # SGD shows a wrong gradient scale (of the experts, say) directly in the weights.
    optimizer: str = "adamw"
    dp: int = 1  # data-parallel replicas owned by ZeRO-3: world = dp x ep, each replica on its own micro-batch
    # DistributedConfig(fsdp_size=ranks, ep_size=ranks // dp): every rank its own micro-batch, tokens sent to their
    # experts by all-to-all (without it, tp_size = ep_size and the ranks of an EP group share a micro-batch)
    dispatch: bool = False
    # After training, save a Hub checkpoint the trainer's way and reload it in one process on the stock tree
    export: bool = False
    # With `export`: every rank saves into a directory of its own, as ranks without a shared filesystem see theirs, so
    # `save_pretrained` gathers the weights to rank 0 instead of writing partitions; rank 0's directory is reloaded
    export_unshared: bool = False
    # HF Trainer only: 4 steps with a checkpoint after 2, then a new launch resumes from it and must end the same
    resume: bool = False
    # ZeRO-3 offloads parameters and optimizer states to the CPU (`offload_param`, `offload_optimizer`): what users
    # turn on when the model does not fit; the load still reads partitions and training must match one process
    offload: bool = False
    # a PEFT LoRA adapter on the attention projections and on every expert (TRL only): the adapters of a rank's experts
    # must be partitioned and reduced like those experts
    lora: bool = False
    # the learning rate where the optimizer's default (SGD 0.1, AdamW 1e-3) would not do
    lr: float | None = None
    # DeepSpeed only: after training, save DeepSpeed's checkpoint, convert it to a Universal Checkpoint and resume
    # it in a new launch on this many ranks (ep = ranks, the same spelling), optimizer state included
    resumed_ranks: int = 0

    @property
    def steps(self) -> int:
        return 2 * RESUME_AFTER if self.resume else self.trainer.steps

    @property
    def shape(self) -> LaunchShape:
        """EP under ZeRO-3: `DistributedConfig(tp_size=ep, ep_size=ep[, dp_replicate_size=dp])`, or with token
        dispatch `DistributedConfig(fsdp_size=ranks, ep_size=ep)`."""
        if self.dispatch:
            return LaunchShape.dispatching(self.ranks, self.ranks // self.dp, zero3=True)
        return LaunchShape.experts_over(self.ranks, self.ranks // self.dp, zero3=True)

    @property
    def resumed_shape(self) -> LaunchShape | None:
        """The topology a Universal Checkpoint of this case resumes at: every rank an EP rank."""
        return replace(self, ranks=self.resumed_ranks, dp=1).shape if self.resumed_ranks else None

    @property
    def label(self) -> str:
        extra = " | frozen + save/reload" if self.checkpoint else ""
        extra += f" | dp {self.dp} x ep {self.ranks // self.dp}" if self.dp > 1 else ""
        extra += " | token dispatch (every rank its own batch)" if self.dispatch else ""
        extra += " | save_pretrained -> reload" if self.export else ""
        extra += " (each rank its own directory: gathered to rank 0)" if self.export_unshared else ""
        extra += " | resume after 2 of 4 steps" if self.resume else ""
        extra += " | parameters and optimizer offloaded to the CPU" if self.offload else ""
        extra += " | LoRA on attention and experts" if self.lora else ""
        extra += f" | Universal Checkpoint -> resumed x{self.resumed_ranks}" if self.resumed_ranks else ""
        return (
            f"training parity | {self.arch} | {self.trainer} x{self.ranks} ({self.trainer.launcher}) | "
            f"{self.optimizer}{f' lr {self.lr:g}' if self.lr else ''}, clip {self.clip}{extra} | {self.tree}"
        )


# The recipes users run. TRL's SFTTrainer against the same recipe under stock dense ZeRO-3 on as many ranks, with SGD:
# AdamW's first step turns float noise in near-zero expert gradients into full-size updates. lr 1e-2, not SGD's 0.1: at
# 0.1 the expert outputs' summation order (all-to-all against one pass) put one q_proj element 1.5e-6 off (2.55e-5
# relative) at step 3 while every other dense weight was bit-equal; at 5e-2 and 1e-2 all of them are. ZeRO-3
# offloading parameters and optimizer states to the CPU, against one process.
RECIPES = (
    ParityCase("qwen3_moe", 2, Trainer.TRL_SFT, clip=0.0, optimizer="sgd", dispatch=True, lr=1e-2, export=True),
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dispatch=True, offload=True, export=True),
    ParityCase("qwen3_moe", 4, Trainer.TRL_SFT, clip=0.0, optimizer="sgd", dp=2, dispatch=True, lr=1e-2, export=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, offload=True),
    ParityCase("qwen3_moe", 2, Trainer.HF_TRAINER, offload=True, export=True),
    # LoRA on the experts too (PEFT `target_parameters`), SGD: the adapter of each rank's experts against the same
    # blocks of the reference's full adapter. lr 1e-2: the reference sums each rank's expert gradient before averaging,
    # EP sums the tokens of every rank in one pass; at lr 0.1 that order alone moved the adapters 1e-5-3e-5 apart
    ParityCase(
        "qwen3_moe", 2, Trainer.TRL_SFT, clip=0.0, optimizer="sgd", dispatch=True, lora=True, lr=1e-2, export=True
    ),
    ParityCase(
        "qwen3_moe",
        4,
        Trainer.TRL_SFT,
        clip=0.0,
        optimizer="sgd",
        dp=2,
        dispatch=True,
        lora=True,
        lr=1e-2,
        export=True,
    ),
)
# Resuming on another topology, optimizer state included: DeepSpeed's checkpoint saved at 4 ranks (ep 4, and dp 2 x
# ep 2), converted to a Universal Checkpoint (DeepSpeed series PR 5 converts experts the caller placed), resumed at 2
# ranks (ep 2) for 3 more steps; one process trains the same steps on each topology's global batches. AdamW: its
# moments are what the conversion must carry.
RESUME_TOPOLOGY = (
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, dispatch=True, resumed_ranks=2),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, dp=2, dispatch=True, resumed_ranks=2),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, resumed_ranks=2),  # tp = ep, clipped
)
TOKEN_DISPATCH = (
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dispatch=True, export=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, checkpoint=True, dispatch=True),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, clip=0.0, dispatch=True),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2, dispatch=True, export=True),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, dp=2, dispatch=True),
    ParityCase("qwen3_moe", 2, Trainer.ACCELERATE, dispatch=True, export=True),
    ParityCase("mixtral", 4, Trainer.ACCELERATE, dp=2, dispatch=True),
    ParityCase("qwen3_moe", 4, Trainer.HF_TRAINER, dp=2, dispatch=True, export=True),
    ParityCase("qwen3_moe", 2, Trainer.HF_TRAINER, dispatch=True, resume=True),
)
# Training parity (EP under ZeRO-3 against one process): every way of training, both architectures, 2 and 4 ranks;
# the stock tree once per way and architecture, to show how it fails.
PARITY_FULL = (
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, export=True),
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, export=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, export=True),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd"),
    ParityCase("mixtral", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True),
    *(
        ParityCase(arch, ranks, way, export=True)
        for way in (Trainer.ACCELERATE, Trainer.HF_TRAINER)
        for arch in ("qwen3_moe", "mixtral")
        for ranks in (2, 4)
    ),
    *(ParityCase(arch, 2, way, tree=Tree.STOCK) for way in Trainer for arch in ("qwen3_moe", "mixtral")),
    # world = dp x ep: 2 replicas of 2 EP ranks, ZeRO-3 owning data parallelism, each replica on its own micro-batch
    *(
        ParityCase(arch, 4, Trainer.DEEPSPEED, clip=clip, dp=2, export=clip == 0)
        for arch in ("qwen3_moe", "mixtral")
        for clip in (0, 1)
    ),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2),
    *(ParityCase(arch, 4, Trainer.HF_TRAINER, dp=2, export=True) for arch in ("qwen3_moe", "mixtral")),
    # Trainer.train(resume_from_checkpoint=...) in a new launch, at ep 2 and at dp 2 x ep 2
    ParityCase("qwen3_moe", 2, Trainer.HF_TRAINER, resume=True),
    ParityCase("mixtral", 4, Trainer.HF_TRAINER, dp=2, resume=True),
    # token dispatch: every rank its own micro-batch, tokens sent to their experts by all-to-all, ZeRO-3 owning the
    # fsdp ranks; W = 2 and 4 with ep = W, and W = 4 with ep = 2 (2 ranks hold each expert: efsdp = 2)
    *TOKEN_DISPATCH,
    *RECIPES,
    *RESUME_TOPOLOGY,
    # ranks that do not share the save directory: the gathered save, its expert shards from every rank
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True, export_unshared=True),
)
# Save -> reload runs on the stock tree's one-process load (an independent reference), so each patched way of
# training that saves has one export case here.
PARITY_FAST = (
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, checkpoint=True),
    ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True),
    ParityCase("mixtral", 2, Trainer.ACCELERATE, export=True),
    ParityCase("qwen3_moe", 2, Trainer.HF_TRAINER, export=True, resume=True),
    ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, tree=Tree.STOCK),
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2, export=True),
    # token dispatch at ep 2 over 4 ranks (efsdp 2), SGD so that a wrong gradient scale shows, saved and reloaded
    ParityCase("qwen3_moe", 4, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dp=2, dispatch=True, export=True),
)
# The main job's (`tox -e multigpu`, bounded at 14.5 min here): the CI subset on the patched tree (the stock case
# stops at the `device_map` gate the matrix's stock load shows), plus token dispatch through accelerate, the TRL recipe
# (a Trainer with token dispatch), LoRA on the experts and resuming at another topology. `--sweep` (`tox -e multigpu
# -- --sweep`) runs every case of PARITY_FULL: each way at ep = world = 4, the 4-rank Trainers.
PARITY_MAIN = (
    *(case for case in PARITY_FAST if case.tree is Tree.PATCHED),
    ParityCase("qwen3_moe", 2, Trainer.ACCELERATE, dispatch=True, export=True),
    RECIPES[0],
    RECIPES[5],
    RESUME_TOPOLOGY[1],
)
