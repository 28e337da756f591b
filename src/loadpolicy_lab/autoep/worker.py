"""One rank of `loadpolicy dev autoep`: load and train with EPMeta or with DeepSpeed AutoEP, measuring both.

`python -m loadpolicy_lab.autoep.worker SPEC OUT`, in a single process or under torchrun. SPEC["mode"] is `single` (the
one-process reference on the concatenated batch), `epmeta` (patched tree) or `autoep` (stock tree, DeepSpeed's
`expert_parallel` section). Times `from_pretrained` and `deepspeed.initialize` with their peak RSS, and gathers the
weights in the Hugging Face layout. Writes OUT/rank<R>.pt and OUT/rank<R>.stage. Method and results: docs/training.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import transformers

from loadpolicy_lab.autoep.contract import AutoEPSpec, ReferenceRun, StageFigures, WayRank
from loadpolicy_lab.harness.device import DeviceWindow, RankDevice, start_deepspeed_distributed
from loadpolicy_lab.harness.procfs import PeakSampler, memory_status, reset_resident_peak
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.harness.setup import show_zero3
from loadpolicy_lab.training import steps as training
from loadpolicy_lab.training.autoep import apply_output_capture_registry_shim


Stage = Callable[[str], None]


# --- measuring ------------------------------------------------------------------------------------------------------


@contextmanager
def _measured(figures: dict[str, StageFigures], name: str, device: RankDevice) -> Iterator[None]:
    """Time the block on this rank and record its peak RSS (and its device's peak); every rank starts it together."""
    torch.distributed.barrier()
    reset_resident_peak()
    before = memory_status()
    start = time.perf_counter()
    with PeakSampler() as sampler, DeviceWindow(device) as on_device:
        yield
    seconds = time.perf_counter() - start
    figures[name] = {
        "seconds": seconds,
        "rss_before": before["RssAnon"] + before["RssFile"] + before["RssShmem"],
        "peak_anon": sampler.peak["anon"],
        "peak_file": sampler.peak["file"],
        "peak_total": max(sampler.peak["total"], memory_status()["VmHWM"]),
        "device_peak_bytes": on_device.peak_bytes,
    }


# --- AutoEP's parameters in the Hugging Face layout -----------------------------------------------------------------


def autoep_layers(module: Any, shapes: dict[str, list[int]], preset: Any) -> dict[str, dict[str, Any]]:
    """Every `AutoEPMoELayer` by module path: this rank's expert rows and the HF layout it replaced.

    `shapes` are the HF parameters' full shapes before `deepspeed.initialize`, `preset` AutoEP's `MoEModelPreset`.
    """
    from deepspeed.moe.fused_expert_layout import classify_fused_gate_up_layout  # noqa: PLC0415

    layers = {}
    for path, layer in module.named_modules():
        if not getattr(layer, "_is_autoep_layer", False):
            continue
        experts = f"{path}.{preset.experts_pattern}"
        w1, w2 = shapes[f"{experts}.{preset.expert_w1}"], shapes[f"{experts}.{preset.expert_w2}"]
        layout = classify_fused_gate_up_layout(tuple(w1), tuple(w2))
        layers[path] = {
            "first_row": int(layer.ep_rank) * int(layer.num_local_experts),
            "rows": int(layer.num_local_experts),
            "layout": None if layout is None else layout.layout,
            "router": preset.router_pattern,
            "experts": preset.experts_pattern,
            "w1": preset.expert_w1,  # fused gate and up: AutoEP's w1 (gate) and w3 (up)
            "w2": preset.expert_w2,  # down: AutoEP's w2
            "shared_experts": preset.shared_experts_pattern,
            "shared_experts_gate": preset.shared_experts_gate_pattern,
        }
    return layers


def to_hf_layout(
    weights: dict[str, Any], layers: dict[str, dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """AutoEP's gathered parameters under the HF names and layout, and the expert rows each expert tensor holds.

    `AutoEPMoELayer` at path P holds `P.router.gate.{weight,bias}` (HF: `P.<router>.{weight,bias}`), this rank's
    experts as `P.experts.w1` (gate) `[E_local, ffn, hidden]`, `w3` (up, same shape) and `w2` (down)
    `[E_local, hidden, ffn]` (HF, fused: `P.experts.gate_up_proj` `[E, 2 ffn, hidden]` = cat(gate, up) along dim 1
    and `down_proj` `[E, hidden, ffn]`, or both transposed in the "hidden_first" layout), and any shared experts
    as `P.shared_experts` / `P.shared_experts_gate`. Every other name is the HF name already. A name this does not
    know (a new AutoEP parameter) is kept as is, so the comparison reports it rather than hiding it.
    """
    out = dict(weights)
    rows: dict[str, list[int]] = {}
    for path, layer in layers.items():
        prefix = f"{path}."
        if layer["layout"] is None:
            raise ValueError(f"{path}: unknown fused expert layout; cannot map AutoEP's experts back")
        gate, up, down = (out.pop(f"{prefix}experts.{w}") for w in ("w1", "w3", "w2"))
        if layer["layout"] == "gate_up_first":
            gate_up = torch.cat([gate, up], dim=1)
        else:  # hidden_first: HF stores [E, hidden, 2 ffn] and [E, ffn, hidden]
            gate_up, down = torch.cat([gate, up], dim=1).transpose(1, 2), down.transpose(1, 2)
        experts = f"{prefix}{layer['experts']}."
        for name, tensor in ((experts + layer["w1"], gate_up), (experts + layer["w2"], down)):
            out[name] = tensor.contiguous()
            rows[name] = [layer["first_row"], layer["first_row"] + layer["rows"]]
        renames = {
            f"{prefix}{autoep}.": f"{prefix}{layer[hf]}."
            for autoep, hf in (
                ("router.gate", "router"),
                ("shared_experts", "shared_experts"),
                ("shared_experts_gate", "shared_experts_gate"),
            )
            if layer[hf]  # a preset without shared experts names none
        }
        for name in [n for n in out if n.startswith(prefix)]:
            for old, new in renames.items():
                if name.startswith(old):
                    out[new + name.removeprefix(old)] = out.pop(name)
                    break
    return out, rows


# --- the three modes ------------------------------------------------------------------------------------------------


def _single(spec: AutoEPSpec, stage: Stage) -> ReferenceRun:
    stage("from_pretrained")
    model = getattr(transformers, spec["model_class"]).from_pretrained(spec["checkpoint"], dtype=torch.float32)
    # The weights as loaded: what each way holds before its first step is compared with them
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    del model
    trained = training.train_single(spec, stage)
    return {"losses": trained["losses"], "weights": trained["weights"], "initial": initial}


def _train(engine: Any, spec: AutoEPSpec, rank: int, world: int, stage: Stage) -> list[float]:
    batches = [
        training.replica_batch(batch, spec, rank, world) for batch in training.fixed_batches(spec, spec["steps"])
    ]
    return training.train_engine(engine, batches, stage)


def _epmeta(spec: AutoEPSpec, rank: int, world: int, device: RankDevice, stage: Stage) -> WayRank:
    import deepspeed  # noqa: PLC0415

    ds_config = training.deepspeed_config(spec, world)
    keep_alive = show_zero3(ds_config)  # noqa: F841  # held while loading
    figures: dict[str, StageFigures] = {}
    stage("from_pretrained")
    with _measured(figures, "load", device):
        model = training.load_ep(spec, world)
    loaded = training.loaded_state(model)
    stage("deepspeed.initialize")
    with _measured(figures, "initialize", device):
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=training.make_optimizer(model, spec), config=ds_config
        )
    stage("gather initial")
    initial = training.gathered_weights(engine.module)
    ep_rank = rank % (world // training.replicas(spec["distributed"]))  # the mesh: dp_replicate outer, tp/ep inner
    rows = {n: [ep_rank * initial[n].shape[0], (ep_rank + 1) * initial[n].shape[0]] for n in loaded["experts"]}
    losses = _train(engine, spec, rank, world, stage)
    stage("gather")
    return {
        "policy": loaded["policy"],
        "experts": loaded["experts"],
        "unchanged": {n: bool(torch.equal(loaded["before"][n], initial[n])) for n in loaded["experts"]},
        "figures": figures,
        "initial": initial,
        "expert_rows": rows,
        "losses": losses,
        "weights": training.gathered_weights(engine.module),
    }


def _autoep(spec: AutoEPSpec, rank: int, world: int, device: RankDevice, stage: Stage) -> WayRank:
    import deepspeed  # noqa: PLC0415
    from deepspeed.module_inject.auto_ep_presets.registry import get_preset  # noqa: PLC0415

    ds_config = training.deepspeed_config(spec, world) | {"expert_parallel": spec["expert_parallel"]}
    keep_alive = show_zero3(ds_config)  # noqa: F841  # held while loading
    figures: dict[str, StageFigures] = {}
    stage("from_pretrained")
    with _measured(figures, "load", device):
        model = getattr(transformers, spec["model_class"]).from_pretrained(spec["checkpoint"], dtype=torch.float32)
    model.train()
    # Full shapes (zero.Init leaves empty placeholders) and how many zero.Init partitioned; no reference is kept to
    # the parameters AutoEP is about to replace.
    shapes = {n: [int(d) for d in getattr(p, "ds_shape", p.shape)] for n, p in model.named_parameters()}
    partitioned = sum(hasattr(p, "ds_id") for p in model.parameters())
    stage("compatibility shim")
    shim = apply_output_capture_registry_shim()
    stage("deepspeed.initialize")
    with _measured(figures, "initialize", device):
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=training.make_optimizer(model, spec), config=ds_config
        )
    stage("gather initial")
    layers = autoep_layers(engine.module, shapes, get_preset(spec["expert_parallel"]["preset_model"]))
    if not layers:
        raise RuntimeError("deepspeed.initialize replaced no MoE block with an AutoEPMoELayer")
    initial, rows = to_hf_layout(training.gathered_weights(engine.module), layers)
    losses = _train(engine, spec, rank, world, stage)
    stage("gather")
    weights, _ = to_hf_layout(training.gathered_weights(engine.module), layers)
    return {
        "policy": f"stock zero.Init ({partitioned}/{len(shapes)} parameters partitioned)",
        "shim_applied": shim,
        "autoep_layers": {
            path: {k: layer[k] for k in ("first_row", "rows", "layout")} for path, layer in layers.items()
        },
        "figures": figures,
        "initial": initial,
        "expert_rows": rows,
        "losses": losses,
        "weights": weights,
    }


def _compare(rank: Rank, spec: AutoEPSpec) -> ReferenceRun | WayRank:
    rank.facts["transformers_file"] = transformers.__file__  # which tree this rank really ran
    getattr(transformers, spec["model_class"])  # import the model's module before anything is timed
    if spec["mode"] == "single":
        return _single(spec, rank.stage)
    rank.stage("init_distributed")
    device = start_deepspeed_distributed()
    match spec["mode"]:
        case "epmeta":
            return _epmeta(spec, rank.rank, rank.world_size, device, rank.stage)
        case "autoep":
            return _autoep(spec, rank.rank, rank.world_size, device, rank.stage)
        case mode:
            raise ValueError(f"unknown mode {mode!r}; accepted: single, epmeta, autoep")


if __name__ == "__main__":
    # A failed rank exits non-zero: torchrun then stops the others rather than leaving them in a collective.
    run_rank(_compare, AutoEPSpec, ".pt")
