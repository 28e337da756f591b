"""One rank of a GPU check case: `python -m loadpolicy_lab.gpu.worker SPEC OUT` (harness/rank.py's protocol).

"reference": one process, the checkpoint loaded plainly onto its device and trained on every rank's batches (the
one-device reference: one GPU on a GPU machine, the CPU on the CPU). "distributed": the case's load under ZeRO-3, where
every partition, placeholder and buffer is, the load saved by partition writes against the checkpoint's tensors,
`STEPS` steps of DeepSpeed training, the trained save against the reference. "read": the read benchmark (`reads.py`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from loadpolicy_lab.gpu.cases import CASES_BY_NAME, STEPS, Case, Kind
from loadpolicy_lab.gpu.contract import GpuSpec
from loadpolicy_lab.harness.device import (
    DeviceWindow,
    RankDevice,
    host,
    rank_device,
    start_deepspeed_distributed,
    to_device,
)
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.harness.setup import show_zero3


LEARNING_RATE = 1e-3
SEQUENCE = 16
# the trained tensors against the one-device reference: float32 on the CPU as the README's example is judged; on a GPU
# the reference is one GPU with TF32 off, and the sums of partitioned gradients run in another order
BOUNDS = {"cpu": 1e-5, "cuda": 1e-4}


def _batch(rank: int, step: int, vocab: int) -> Any:
    import torch  # noqa: PLC0415

    generator = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, vocab, (1, SEQUENCE), generator=generator)


def _exact_matmuls() -> None:
    import torch  # noqa: PLC0415

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _tensors(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file  # noqa: PLC0415

    tensors: dict[str, Any] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors |= load_file(file)
    return tensors


def _unequal(saved: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    import torch  # noqa: PLC0415

    problems = [f"missing {name}" for name in sorted(expected.keys() - saved.keys())]
    problems += [f"extra {name}" for name in sorted(saved.keys() - expected.keys())]
    problems += [n for n in sorted(saved.keys() & expected.keys()) if not torch.equal(saved[n], expected[n])]
    return problems


def _reference(this: Rank, spec: GpuSpec) -> dict[str, Any]:
    """The checkpoint loaded plainly on one device and trained on every rank's batches, in rank order."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    from loadpolicy_lab.models.architectures import ARCHITECTURES  # noqa: PLC0415
    from loadpolicy_lab.models.checkpoints import build_checkpoint  # noqa: PLC0415

    _exact_matmuls()
    device = rank_device()
    checkpoint = Path(spec["checkpoint"])
    this.stage("build the checkpoint")
    build_checkpoint(checkpoint.name, checkpoint.parent)
    this.stage("train the reference")
    cls = getattr(transformers, ARCHITECTURES[checkpoint.name].model_class)
    model = cls.from_pretrained(checkpoint, dtype=torch.float32).to(device.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for step in range(STEPS):
        ids = torch.cat([_batch(rank, step, model.config.vocab_size) for rank in range(spec["world"])])
        ids = to_device(ids, device.device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(host(loss)))
    model.save_pretrained(spec["reference"])
    return {"rank": 0, "device": str(device.device), "losses": losses, "transformers_file": transformers.__file__}


def _zero3_config(case: Case) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": 3}
    if case.offload:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "zero_optimization": zero,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
    }


def _misplaced(model: Any, case: Case, device: RankDevice) -> tuple[list[str], int]:
    """Every partition, placeholder (what a parameter is between gathers) and buffer not where the case needs it:
    partitions on the rank's device (the host under offload), placeholders and buffers on the rank's device."""
    partition_device = "cpu" if case.offload else device.device.type
    problems, checked = [], 0
    for name, param in model.named_parameters():
        checked += 1
        partition = getattr(param, "ds_tensor", None)
        if partition is None:
            problems.append(f"{name}: not partitioned by ZeRO-3")
            continue
        if partition.device.type != partition_device:
            problems.append(f"{name}: partition on {partition.device}, expected {partition_device}")
        if param.device != device.device:
            problems.append(f"{name}: placeholder on {param.device}, expected {device.device}")
    for name, buffer in model.named_buffers():
        checked += 1
        if buffer.device != device.device:
            problems.append(f"{name}: buffer on {buffer.device}, expected {device.device}")
    return problems, checked


def _train(engine: Any, rank: int, vocab: int) -> list[float]:
    losses = []
    for step in range(STEPS):
        ids = to_device(_batch(rank, step, vocab), engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(float(host(loss)))
    return losses


def _against_reference(trained_dir: Path, reference_dir: Path, checkpoint: Path) -> tuple[float | None, int]:
    """The largest difference of the trained save from the reference's (NaN if any is; None if their keys differ),
    and how many trained tensors moved from the checkpoint's."""
    import torch  # noqa: PLC0415

    trained, reference, loaded = _tensors(trained_dir), _tensors(reference_dir), _tensors(checkpoint)
    common = sorted(trained.keys() & reference.keys())
    diff = None
    if common and trained.keys() == reference.keys():
        diffs = [float((trained[n] - reference[n]).abs().max()) for n in common]
        diff = math.nan if any(math.isnan(d) for d in diffs) else max(diffs)
    return diff, sum(1 for n in common if n in loaded and not torch.equal(trained[n], loaded[n]))


def _load(case: Case, checkpoint: Path, world: int, device: RankDevice) -> tuple[Any, float, int | None]:
    """The case's `from_pretrained`: the model, its seconds (the device synchronised) and the device's peak."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from transformers import DistributedConfig  # noqa: PLC0415

    from loadpolicy_lab.models.architectures import ARCHITECTURES  # noqa: PLC0415

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if case.ep:
        kwargs["distributed_config"] = DistributedConfig(fsdp_size=world, ep_size=world)
    cls = getattr(transformers, ARCHITECTURES[checkpoint.name].model_class)
    start = time.perf_counter()
    with DeviceWindow(device) as on_device:
        model = cls.from_pretrained(checkpoint, **kwargs)
    return model, time.perf_counter() - start, on_device.peak_bytes


def _distributed(this: Rank, spec: GpuSpec) -> dict[str, Any]:
    import deepspeed  # noqa: PLC0415
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    _exact_matmuls()
    case, world, checkpoint = CASES_BY_NAME[spec["case"]], this.world_size, Path(spec["checkpoint"])
    config = _zero3_config(case)
    keep_alive = show_zero3(config)  # noqa: F841  # held while loading
    this.stage("init_distributed")
    device = start_deepspeed_distributed()
    this.stage("from_pretrained")
    model, load_seconds, load_peak = _load(case, checkpoint, world, device)
    this.stage("placement")
    misplaced, placed = _misplaced(model, case, device)
    out = Path(spec["out"])
    this.stage("save the loaded model")
    model.save_pretrained(out / "loaded")
    torch.distributed.barrier()
    saved_unequal, compared = None, 0
    if this.rank == 0:
        expected = _tensors(checkpoint)
        saved_unequal, compared = _unequal(_tensors(out / "loaded"), expected), len(expected)
    this.stage("train")
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    losses = _train(engine, this.rank, model.config.vocab_size)
    this.stage("save the trained model")
    engine.module.save_pretrained(out / "trained")
    torch.distributed.barrier()
    diff, moved = (
        _against_reference(out / "trained", Path(spec["reference"]), checkpoint) if this.rank == 0 else (None, 0)
    )
    torch.distributed.barrier()
    policy = getattr(model, "_load_policy", None)
    return {
        "rank": this.rank,
        "device": str(device.device),
        "backend": device.backend,
        "policy": None if policy is None else type(policy).__name__,
        "transformers_file": transformers.__file__,
        "load_seconds": load_seconds,
        "device_peak_bytes": load_peak,
        "misplaced": misplaced,
        "placed": placed,
        "losses": losses,
        "saved_unequal": saved_unequal,
        "compared": compared,
        "trained_max_diff": None if diff is None or math.isnan(diff) else diff,
        "moved": moved,
        "bound": BOUNDS.get(device.device.type, BOUNDS["cuda"]),
    }


def _body(this: Rank, spec: GpuSpec) -> dict[str, Any]:
    if spec["mode"] == "reference":
        return _reference(this, spec)
    if CASES_BY_NAME[spec["case"]].kind is Kind.READ:
        from loadpolicy_lab.gpu.reads import measure_reads  # noqa: PLC0415

        return measure_reads(this, spec)
    return _distributed(this, spec)


if __name__ == "__main__":
    run_rank(_body, GpuSpec)
