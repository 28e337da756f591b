"""Training on fixed data, once in one process and once with EP under DeepSpeed ZeRO-3: the steps every suite that
trains takes (parity, AutoEP, throughput), each rank's micro-batch of the same global batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import transformers

from loadpolicy_lab.harness.device import host, rank_device, to_device
from loadpolicy_lab.harness.setup import zero3_config
from loadpolicy_lab.training.contract import SingleRun, TrainingSpec


Stage = Callable[[str], None]
MICRO_BATCH = 2


def replicas(sizes: Mapping[str, int | bool]) -> int:
    """Distinct micro-batches per step, as the distributed config the ranks load with says: one per data-parallel
    replica of a tp = ep group (`dp_replicate_size`), one per rank with token dispatch (`fsdp_size`)."""
    batches: int = sizes.get("dp_replicate_size", 1) * sizes.get("fsdp_size", 1)
    return batches


def fixed_batches(spec: TrainingSpec, steps: int, first: int = 0) -> list[Any]:
    """One fixed global batch per step (steps `first` on): `dp` micro-batches of MICRO_BATCH rows, one per
    data-parallel replica."""
    rows = MICRO_BATCH * replicas(spec["distributed"])
    seeds = range(first, first + steps)
    return [torch.randint(0, 64, (rows, 8), generator=torch.Generator().manual_seed(s)) for s in seeds]


def replica_batch(batch: Any, spec: TrainingSpec, rank: int, world: int) -> Any:
    """This rank's micro-batch: the ranks of one tp = ep group (one replica) share it; with token dispatch every rank
    has its own."""
    replica = rank // (world // replicas(spec["distributed"]))
    return batch[replica * MICRO_BATCH : (replica + 1) * MICRO_BATCH]


def freeze(model: Any, frozen: list[str]) -> None:
    for name, param in model.named_parameters():
        if any(part in name for part in frozen):
            param.requires_grad_(False)


def deepspeed_config(spec: TrainingSpec, world: int) -> dict[str, Any]:
    # What `Trainer.save_model` and `accelerator.get_state_dict` need to write full weights
    zero: dict[str, Any] = {"stage3_gather_16bit_weights_on_model_save": True}
    offload: dict[str, Any] = {}
    if spec["offload"]:
        zero |= {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
        offload = {"zero_force_ds_cpu_optimizer": False}  # the torch optimizer of the reference, not DeepSpeed's
    return zero3_config(
        world,
        micro_batch=MICRO_BATCH,
        zero=zero,
        gradient_accumulation_steps=1,
        gradient_clipping=spec["clip"],  # DeepSpeed clips to 1.0 when this is left out
        steps_per_print=10_000,
        zero_allow_untested_optimizer=spec["optimizer"] == "sgd",
        **offload,
    )


def make_optimizer(model: Any, spec: TrainingSpec) -> Any:
    trainable = [p for p in model.parameters() if p.requires_grad]
    if spec["optimizer"] == "sgd":
        return torch.optim.SGD(trainable, lr=spec["lr"])
    return torch.optim.AdamW(trainable, lr=spec["lr"], weight_decay=0.0)


def train_single(spec: TrainingSpec, stage: Stage) -> SingleRun:
    model = getattr(transformers, spec["model_class"]).from_pretrained(spec["checkpoint"], dtype=torch.float32)
    model.train()
    freeze(model, spec["frozen"])
    optimizer = make_optimizer(model, spec)
    losses = []
    batches = fixed_batches(spec, spec["steps"])
    if spec["resumed_steps"]:  # then the resumed topology's global batches
        batches += fixed_batches(
            spec | {"distributed": spec["resumed_distributed"]}, spec["resumed_steps"], len(batches)
        )
    for step, ids in enumerate(batches):
        stage(f"step {step}")
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if spec["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def load_ep(spec: TrainingSpec, world: int) -> Any:
    from transformers import DistributedConfig  # noqa: PLC0415

    # world = dp x ep: ZeRO-3 owns the dp replicas, experts are sharded over the ep ranks of each (`LaunchShape`)
    model = getattr(transformers, spec["model_class"]).from_pretrained(
        spec["checkpoint"], dtype=torch.float32, distributed_config=DistributedConfig(**spec["distributed"])
    )
    model.train()
    freeze(model, spec["frozen"])
    return model


def _experts(model: Any) -> list[str]:
    """The parameters the load handed to DeepSpeed's expert groups (this rank's shards)."""
    return [n for n, p in model.named_parameters() if getattr(p, "ds_zero_placement_family", "") == "autoep_expert"]


def gathered_weights(module: Any) -> dict[str, Any]:
    import deepspeed  # noqa: PLC0415

    partitioned = [p for _, p in module.named_parameters() if hasattr(p, "ds_id")]
    with deepspeed.zero.GatheredParameters(partitioned):  # on the host: judged against one process on the CPU
        return {n: host(p).clone() for n, p in module.named_parameters()}


def loaded_state(model: Any) -> dict[str, Any]:
    """What the load handed over, recorded before DeepSpeed sees the model."""
    experts = _experts(model)
    groups = {
        tuple(torch.distributed.get_process_group_ranks(p.ds_zero_partition_process_group))
        for n, p in model.named_parameters()
        if n in experts
    }
    return {
        "policy": type(getattr(model, "_load_policy", None)).__name__,  # NoneType on the stock tree
        "experts": experts,
        # gathered: with partition reads the shards are ZeRO-3 partitions over their expert data-parallel group already
        "before": {n: t for n, t in gathered_weights(model).items() if n in experts},
        # the ranks DeepSpeed partitions this rank's expert shards over (one group for all of them, or a problem)
        "expert_group_ranks": [list(g) for g in sorted(groups)],
    }


def unchanged_experts(loaded: dict[str, Any], module: Any) -> dict[str, bool]:
    """Every expert shard must survive the wrap bit for bit (no broadcast from rank 0, no repartition)."""
    after = gathered_weights(module)
    return {n: bool(torch.equal(loaded["before"][n], after[n])) for n in loaded["experts"]}


def ep_engine(
    spec: TrainingSpec, world: int, stage: Stage, extra: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    import deepspeed  # noqa: PLC0415

    stage("from_pretrained")
    rank_device()  # one GPU per rank (made current) or the CPU; the load starts the process group
    model = load_ep(spec, world)
    loaded = loaded_state(model)
    stage("deepspeed.initialize")
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=make_optimizer(model, spec), config=deepspeed_config(spec, world) | (extra or {})
    )
    return engine, loaded


def train_engine(engine: Any, batches: list[Any], stage: Stage, first: int = 0) -> list[float]:
    """Train on `batches` (this rank's micro-batches, on the engine's device)."""
    losses = []
    for step, batch in enumerate(batches, start=first):
        stage(f"step {step}")
        ids = to_device(batch, engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses
