"""Hand an EPMeta-loaded model to DeepSpeed ZeRO-3 so that training equals a single process.

Why each step (docs/training.md has the measurements):

1. Load with the dense TP rules resolved to "replicate" (`replicated_dense_plan`): dense weights stay whole for ZeRO-3
   to partition; only the experts are sharded (by EP rank, `Shard(0)`).
2. DeepSpeed cannot wrap DTensor parameters (`Couldn't swap Embedding.weight`), so every DTensor parameter becomes a
   plain `nn.Parameter` of its local shard. The EP forward keeps working on plain tensors.
3. The expert shards differ per EP rank, so ZeRO-3 must neither broadcast them from rank 0 nor partition them over
   the world: they are tagged for DeepSpeed's expert groups (`allreduce=False`, `group_name`), partitioned only within
   their expert-data-parallel group (`ds_zero_partition_process_group`), and marked as AutoEP experts so the gradient
   norm and averaging treat them as experts (`ds_zero_placement_family`, `ds_zero_partition_group_name`).
4. The ranks of one EP group share the batch, and DeepSpeed divides expert gradients by the dense data-parallel world;
   the right divisor is world / tp, so expert gradients are scaled by tp.

Everything here relies on private or undocumented DeepSpeed 0.19.8 attributes; this module is the one place that
touches them, and `tox -e multigpu`'s parity runs guard it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


def replicated_dense_plan(tp_plan: dict[str, str]) -> dict[str, str]:
    """A `DistributedConfig(tp_plan=...)` override that keeps every dense module whole (experts stay EP-sharded)."""
    return dict.fromkeys(tp_plan, "replicate")


def localize_dtensor_parameters(model: Any) -> list[tuple[str, Any]]:
    """Replace each DTensor parameter by a plain Parameter of its local shard; return the replaced (name, param)."""
    replaced = []
    for module_name, module in model.named_modules():
        for name, param in list(module._parameters.items()):
            if param is not None and isinstance(param.data, DTensor):
                local = torch.nn.Parameter(param.data.to_local().detach().clone(), requires_grad=param.requires_grad)
                module._parameters[name] = local
                replaced.append((f"{module_name}.{name}" if module_name else name, local))
    return replaced


def prepare_ep_model_for_deepspeed(model: Any, ep_size: int, tp_size: int) -> list[str]:
    """Steps 2-4 above, in place, before `deepspeed.initialize`; returns the names of the expert parameters."""
    import deepspeed  # noqa: PLC0415  # only needed when training with DeepSpeed
    from deepspeed.utils import groups  # noqa: PLC0415

    experts = localize_dtensor_parameters(model)
    if not experts:
        raise ValueError("No DTensor (expert-parallel) parameters found: load the model with ep_size > 1 first.")
    deepspeed.init_distributed()
    group_name = f"ep_size_{ep_size}"
    if group_name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep_size)
    expert_data_parallel = groups._get_expert_data_parallel_group(group_name)
    for _, param in experts:
        param.allreduce = False
        param.group_name = group_name
        param.ds_zero_partition_process_group = expert_data_parallel
        param.ds_zero_placement_family = "autoep_expert"
        param.ds_zero_partition_group_name = group_name
        param.register_hook(lambda grad: grad * tp_size)
    return [name for name, _ in experts]
