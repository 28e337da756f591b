"""The thin adapter: gather the selector's inputs from a live process (transformers, DeepSpeed, torch.distributed).

Everything global is read here and nowhere else, so the selector stays pure. Import this inside a launched process to
print the decision every rank will take, e.g. `print(loadpolicy.live.explain_live(dist_config).to_text())`.
"""

from __future__ import annotations

import importlib
import os
from typing import Protocol

from loadpolicy.explain import Explanation, explain
from loadpolicy.policy import LoadInputs, ParallelSizes, PolicyName
from loadpolicy.sizes import check_world_size


class DistributedConfigLike(Protocol):
    """The fields of a normalised transformers `DistributedConfig` that the policy reads."""

    tp_size: int
    ep_size: int
    fsdp_size: int
    pp_size: int
    dp_replicate_size: int


def sizes_of(distributed_config: DistributedConfigLike | None) -> ParallelSizes:
    """Sizes of an already-normalised `DistributedConfig` (its `__post_init__` resolved every `None`)."""
    if distributed_config is None:
        return ParallelSizes()
    return ParallelSizes(
        tp=distributed_config.tp_size,
        ep=distributed_config.ep_size,
        fsdp=distributed_config.fsdp_size,
        pp=distributed_config.pp_size,
        dp_replicate=distributed_config.dp_replicate_size,
    )


def live_inputs(
    distributed_config: DistributedConfigLike | None = None,
    *,
    quantized: bool = False,
    requested: PolicyName | None = None,
) -> LoadInputs:
    """The inputs `from_pretrained` would select with in this process right now."""
    deepspeed_integration = importlib.import_module("transformers.integrations.deepspeed")
    modeling_utils = importlib.import_module("transformers.modeling_utils")
    return LoadInputs(
        zero3_enabled=bool(deepspeed_integration.is_deepspeed_zero3_enabled()),
        quantized=quantized,
        outer_zero3_init=bool(getattr(modeling_utils, "_is_ds_init_called", False)),
        # absent on a tree without partition reads (stock): gather and copy there
        zero3_flat_partitions=bool(getattr(deepspeed_integration, "zero3_keeps_flat_partitions", lambda: False)()),
        sizes=sizes_of(distributed_config),
        requested=requested,
    )


def explain_live(
    distributed_config: DistributedConfigLike | None = None,
    *,
    quantized: bool = False,
    requested: PolicyName | None = None,
) -> Explanation:
    """The decision `from_pretrained` would take here; refuses sizes that do not span this launch's ranks."""
    inputs = live_inputs(distributed_config, quantized=quantized, requested=requested)
    world_size = launch_world_size()
    if world_size is not None:
        check_world_size(inputs.sizes, world_size)
    return explain(inputs)


def launch_world_size() -> int | None:
    """The process group's size once it exists, else the launcher's WORLD_SIZE; None outside a launch."""
    distributed = importlib.import_module("torch.distributed")
    if distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_world_size())
    world = os.environ.get("WORLD_SIZE")
    return int(world) if world else None


def rank_prefix() -> str:
    """`[rank R/W] ` from the launcher's environment, so every rank's line says whose it is."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    return f"[rank {rank}/{world}] " if rank is not None and world is not None else ""
