"""Train K steps on fixed data, once in a single process and once with EP under DeepSpeed ZeRO-3 (one rank each).

`python -m loadpolicy.validate.parity_worker SPEC OUT` (single process, or under torchrun). Writes the per-step
losses and the final weights (gathered; expert weights as this rank's shard) to OUT/rank<R>.pt, and a stage file.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import deepspeed
import torch
import transformers
from transformers import DistributedConfig
from transformers.integrations.deepspeed import HfDeepSpeedConfig

from loadpolicy.training import prepare_ep_model_for_deepspeed, replicated_dense_plan


def _batch() -> tuple[Any, Any]:
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return ids, ids.clone()


def _single(spec: dict[str, Any]) -> dict[str, Any]:
    model = getattr(transformers, spec["model_class"]).from_pretrained(spec["checkpoint"], dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"])
    ids, labels = _batch()
    losses = []
    for _ in range(spec["steps"]):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        if spec["clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip"])
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _ep_zero3(spec: dict[str, Any], stage: Any) -> dict[str, Any]:
    world = int(os.environ["WORLD_SIZE"])
    config = {
        "zero_optimization": {"stage": 3},
        "train_batch_size": 2 * world,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": spec["clip"],
        "steps_per_print": 10_000,
    }
    model_class = getattr(transformers, spec["model_class"])
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841  # held by a weak reference
    # The TP plan of the class (not the instance): read from a meta-device build, nothing allocated.
    with torch.device("meta"):
        tp_plan = model_class(transformers.AutoConfig.from_pretrained(spec["checkpoint"])).tp_plan
    stage("from_pretrained")
    model = model_class.from_pretrained(
        spec["checkpoint"],
        dtype=torch.float32,
        distributed_config=DistributedConfig(tp_size=world, ep_size=world, tp_plan=replicated_dense_plan(tp_plan)),
    )
    policy = type(model._load_policy).__name__
    stage("prepare_ep_model_for_deepspeed")
    experts = prepare_ep_model_for_deepspeed(model, ep_size=world, tp_size=world)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n in experts}
    stage("deepspeed.initialize")
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"])
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    after = dict(engine.module.named_parameters())
    # Every expert shard must survive deepspeed.initialize bit for bit (no broadcast from rank 0, no repartition).
    # ZeRO-3 has partitioned them (within a one-rank group): gather to read them back.
    with deepspeed.zero.GatheredParameters([after[n] for n in experts]):
        unchanged = {n: bool(torch.equal(before[n], after[n].data)) for n in experts}
    ids, labels = _batch()
    losses = []
    for step in range(spec["steps"]):
        stage(f"step {step}")
        loss = engine(input_ids=ids, labels=labels).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    stage("gather")
    partitioned = [p for _, p in engine.module.named_parameters() if hasattr(p, "ds_id")]
    with deepspeed.zero.GatheredParameters(partitioned):
        weights = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    return {"losses": losses, "weights": weights, "experts": experts, "unchanged": unchanged, "policy": policy}


def main(spec_path: str, out_dir: str) -> None:
    out = Path(out_dir)
    rank = int(os.environ.get("RANK", "0"))
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))

    def stage(name: str) -> None:
        (out / f"rank{rank}.stage").write_text(name, encoding="utf-8")

    try:
        stage("start")
        result = _single(spec) if spec["mode"] == "single" else _ep_zero3(spec, stage)
        stage("done")
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    torch.save(result, out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
