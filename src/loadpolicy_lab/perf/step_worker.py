"""One rank of a training step at real width: `python -m loadpolicy_lab.perf.step_worker SPEC OUT` under torchrun.

Loads the checkpoint as the benchmark's case does (bf16), wraps it with `deepspeed.initialize` (ZeRO-3, bf16, plain
SGD), takes one step on its micro-batch of the fixed batch (`perf.step`), and reports the gradient (before the step)
and the float32 weight (after it) at the reference's positions that its ZeRO-3 partitions hold: no gather.
Writes OUT/rank<R>.json (`StepRank`).
"""

from __future__ import annotations

from typing import Any, TypedDict

from loadpolicy_lab.harness.device import host, start_deepspeed_distributed, to_device
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.harness.setup import show_zero3, zero3_config
from loadpolicy_lab.perf.contract import BenchSpec


class StepSpec(BenchSpec):
    step_reference: str  # the one-process step (`perf.step`), whose positions every rank reports
    replicas: int  # data-parallel replicas, each with its own micro-batch


class StepRank(TypedDict):
    rank: int
    policy: str | None  # stock transformers has no `_load_policy`
    transformers_file: str
    loss: float  # this rank's micro-batch's
    # per parameter: the indices (into the reference's positions) this rank holds, its gradient and new weight there
    samples: dict[str, dict[str, list[Any]]]


def step_config(world: int, rows: int) -> dict[str, Any]:
    return zero3_config(
        world,
        micro_batch=rows,
        # the optimizer's float32 buffers and the gradients' reduction buckets in pieces: the ranks share one host
        zero={"sub_group_size": 100_000_000, "reduce_bucket_size": 50_000_000},
        bf16={"enabled": True},
        gradient_clipping=0.0,  # DeepSpeed clips to 1.0 when this is left out
        zero_allow_untested_optimizer=True,  # torch's SGD, as the reference steps
        steps_per_print=10_000,
    )


def _held(params: dict[str, Any], chosen: dict[str, Any], local: Any) -> dict[str, dict[str, Any]]:
    """`local(param)` (a tensor laid out as the parameter's ZeRO-3 partition) at the chosen positions it holds."""
    import torch  # noqa: PLC0415

    from loadpolicy_lab.perf.fingerprint import partition_place  # noqa: PLC0415

    held: dict[str, dict[str, Any]] = {}
    for name, param in params.items():
        if name not in chosen:  # the judge names it
            held[name] = {"index": [], "values": []}
            continue
        if not hasattr(param, "ds_tensor"):
            raise RuntimeError(f"{name} is not a ZeRO-3 partitioned parameter after deepspeed.initialize")
        first, count, _ = partition_place(param)
        where = chosen[name]
        index = torch.nonzero((where >= first) & (where < first + count)).reshape(-1)
        flat = local(param).reshape(-1)  # on the rank's device; the positions and the values read on the host
        values = host(flat[to_device(where[index] - first, flat.device)]).double()
        held[name] = {"index": index.tolist(), "values": values.tolist()}
    return held


def _step(this: Rank, spec: StepSpec) -> StepRank:
    import deepspeed  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from deepspeed.utils import safe_get_local_fp32_param, safe_get_local_grad  # noqa: PLC0415

    from loadpolicy_lab.perf.step import LEARNING_RATE, batch, rows_of  # noqa: PLC0415
    from loadpolicy_lab.perf.worker import load  # noqa: PLC0415

    reference = torch.load(spec["step_reference"], weights_only=True)
    config = transformers.AutoConfig.from_pretrained(spec["checkpoint"])
    ids = rows_of(batch(config.get_text_config().vocab_size), this.rank, this.world_size, spec["replicas"])
    zero3 = step_config(this.world_size, ids.shape[0])
    keep_alive = show_zero3(zero3)  # noqa: F841  # held while loading
    this.stage("init_distributed")
    start_deepspeed_distributed()
    this.stage("from_pretrained")
    model = load(spec, getattr(transformers, spec["model_class"]))
    model.train()
    this.stage("deepspeed.initialize")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LEARNING_RATE)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=zero3)
    this.stage("forward and backward")
    ids = to_device(ids, engine.device)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    params = dict(engine.module.named_parameters())
    this.stage("gradients")
    grads = _held(params, reference["positions"], safe_get_local_grad)
    this.stage("step")
    engine.step()
    weights = _held(params, reference["positions"], safe_get_local_fp32_param)
    policy = getattr(model, "_load_policy", None)
    return {
        "rank": this.rank,
        "policy": None if policy is None else type(policy).__name__,
        "transformers_file": transformers.__file__,
        "loss": loss.item(),
        "samples": {
            name: {"index": grads[name]["index"], "grad": grads[name]["values"], "weight": weights[name]["values"]}
            for name in grads
        },
    }


if __name__ == "__main__":
    run_rank(_step, StepSpec)
