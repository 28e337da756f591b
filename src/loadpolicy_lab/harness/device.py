"""The one place a launch's device and process-group backend are decided, on both sides of a launch.

A rank (`rank_device`): one CUDA GPU per rank with nccl where this rank's local index has a GPU of its own, else the
CPU with gloo; `LOADPOLICY_DEVICE=cpu|cuda` overrides (cuda without a GPU for the rank is an error). The runner
(`launch_on_cpu`): a launch of more ranks than GPUs visible (or `LOADPOLICY_DEVICE=cpu`) runs with the GPUs hidden
(`CUDA_VISIBLE_DEVICES=""`), so that no rank binds a GPU another rank lacks. And what the workers do with the choice:
the process group, the accelerate and `TrainingArguments` device settings, where a collective's tensors live
(`collective_device`), results back on the host before they are judged, clocks read after the device is done, the
device's peak memory beside the host's.

torch, DeepSpeed and accelerate are imported inside the functions that need them, which the ranks call: the runner
imports this module with or without them (the package itself is standard library only) and counts the GPUs in a
child process (`visible_gpus`).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from loadpolicy.errors import CommandError


# LOADPOLICY_DEVICE: unset (or empty) lets the GPUs visible decide; cuda-shared puts every rank on cuda:0 with gloo
# (several ranks on one GPU: what a one-GPU machine can show of a multi-rank load)
DEVICE_ENV = "LOADPOLICY_DEVICE"
DEVICES = ("cpu", "cuda", "cuda-shared")
# the environment of a launch that must not see a GPU
HIDE_GPUS = {"CUDA_VISIBLE_DEVICES": ""}
GPU_BACKEND = "nccl"
CPU_BACKEND = "gloo"


class DeviceChoiceError(CommandError):
    """LOADPOLICY_DEVICE asks for what this machine cannot give: an unknown value, or CUDA without a GPU per rank."""


@dataclass(frozen=True, slots=True)
class RankDevice:
    """Where a rank computes (`device`, a `torch.device`) and the backend of its process group."""

    device: Any  # torch.device
    backend: str

    @property
    def on_cpu(self) -> bool:
        return bool(self.device.type == "cpu")


def requested_device() -> str | None:
    """LOADPOLICY_DEVICE: "cpu", "cuda", or None (unset or empty); another value is an error naming it."""
    value = os.environ.get(DEVICE_ENV, "").strip()
    if not value:
        return None
    if value not in DEVICES:
        raise DeviceChoiceError(f"{DEVICE_ENV}={value!r}; accepted: {', '.join(DEVICES)}, or unset")
    return value


def _gpus_visible() -> int:
    """CUDA GPUs this process sees (a rank: it has torch imported already)."""
    import torch  # noqa: PLC0415  # optional: the `live` extra

    count: int = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count


# run by this interpreter in a child process: 0 where torch is not installed (no rank has CUDA then)
_COUNT_GPUS = """
try:
    import torch
except ImportError:
    print(0)
else:
    print(torch.cuda.device_count() if torch.cuda.is_available() else 0)
"""


@functools.cache
def visible_gpus() -> int:
    """CUDA GPUs the ranks this process launches see, counted once by this interpreter in a child process with this
    environment: the runner never imports torch itself (what it would hold is memory the ranks it measures lack)."""
    counted = subprocess.run(
        [sys.executable, "-c", _COUNT_GPUS], capture_output=True, text=True, timeout=300, check=False
    )
    if counted.returncode != 0:
        raise RuntimeError(f"counting the GPUs visible failed (exit {counted.returncode}): {counted.stderr[-800:]}")
    return int(counted.stdout.strip())


def _too_few_gpus(needed: int, gpus: int, value: str = "cuda") -> DeviceChoiceError:
    what = "a GPU for every rank to share" if value == "cuda-shared" else "one GPU per rank"
    return DeviceChoiceError(
        f"{DEVICE_ENV}={value} needs {what}: {needed} needed, {gpus} visible; accepted: "
        f"{', '.join(DEVICES)}, or unset (a GPU per rank where there are enough, else the CPU)"
    )


def rank_device(local_rank: int | None = None) -> RankDevice:
    """This rank's device and backend: GPU `local_rank` (LOCAL_RANK by default, 0 without a launcher) with nccl where
    CUDA has a GPU of that index, made the current CUDA device; else the CPU with gloo."""
    import torch  # noqa: PLC0415  # optional: the `live` extra

    index = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    requested = requested_device()
    gpus = _gpus_visible()
    if requested == "cuda-shared":
        if not gpus:
            raise _too_few_gpus(1, gpus, "cuda-shared")
        torch.cuda.set_device(0)
        return RankDevice(torch.device("cuda", 0), CPU_BACKEND)
    if requested == "cpu" or (requested is None and gpus <= index):
        return RankDevice(torch.device("cpu"), CPU_BACKEND)
    if gpus <= index:
        raise _too_few_gpus(index + 1, gpus)
    torch.cuda.set_device(index)
    return RankDevice(torch.device("cuda", index), GPU_BACKEND)


def host_rank_device() -> RankDevice:
    """The CPU with gloo on any machine: for a rank whose tensors stay in host memory by design (the readers that
    measure storage against a load)."""
    import torch  # noqa: PLC0415  # optional: the `live` extra

    return RankDevice(torch.device("cpu"), CPU_BACKEND)


def start_process_group(device: RankDevice | None = None, *, timeout: timedelta | None = None) -> RankDevice:
    """torch's default process group on `device`'s backend (`rank_device()` by default); the device."""
    import torch  # noqa: PLC0415  # optional: the `live` extra

    chosen = rank_device() if device is None else device
    bound = {} if timeout is None else {"timeout": timeout}
    torch.distributed.init_process_group(backend=chosen.backend, **bound)
    return chosen


def start_deepspeed_distributed(device: RankDevice | None = None, *, timeout: timedelta | None = None) -> RankDevice:
    """`deepspeed.init_distributed` on `device`'s backend (`rank_device()` by default); the device."""
    import deepspeed  # noqa: PLC0415  # optional: the `live` extra

    chosen = rank_device() if device is None else device
    bound = {} if timeout is None else {"timeout": timeout}
    deepspeed.init_distributed(dist_backend=chosen.backend, **bound)
    return chosen


def collective_device_for(backend_config: str, current_index: Callable[[str], int]) -> Any:
    """The device a collective's tensors must be on, for a group whose backend config reads `backend_config`
    (`str(torch.distributed.get_backend_config(group))`: "cpu:gloo,cuda:gloo", "cuda:nccl", "cpu:gloo,cuda:nccl"):
    the CPU where a CPU backend serves the group, else the current device (`current_index(device_type)`) of the first
    device type it names (nccl: the current CUDA device; xccl, hccl alike)."""
    import torch  # noqa: PLC0415  # optional: the `live` extra

    types = []
    for entry in backend_config.split(","):
        device_type, colon, backend = entry.strip().partition(":")
        if not (colon and device_type and backend):
            raise ValueError(f"backend config {backend_config!r}: {entry!r} is not DEVICE:BACKEND")
        types.append(device_type)
    if "cpu" in types:
        return torch.device("cpu")
    return torch.device(types[0], current_index(types[0]))


def collective_device(group: Any = None) -> Any:
    """The device the tensors of a collective over `group` (the default group for None) must be on."""
    import torch  # noqa: PLC0415  # optional: the `live` extra

    def current_index(device_type: str) -> int:
        index: int = getattr(torch, device_type).current_device()
        return index

    return collective_device_for(str(torch.distributed.get_backend_config(group)), current_index)


def accelerator_kwargs_handlers(device: RankDevice) -> list[Any]:
    """`Accelerator(kwargs_handlers=...)`: on the CPU, told to start its backend (with the default, under DeepSpeed
    every rank reports process_index 0: running-distributed-on-cpu.md); on a GPU, none (accelerate starts nccl)."""
    if not device.on_cpu:
        return []
    from accelerate.utils import InitProcessGroupKwargs  # noqa: PLC0415  # optional: the `live` extra

    return [InitProcessGroupKwargs(backend=device.backend)]


def training_args_device_kwargs(device: RankDevice) -> dict[str, bool]:
    """`TrainingArguments(**...)`: `use_cpu` on the CPU only (on a GPU the Trainer takes cuda:LOCAL_RANK)."""
    return {"use_cpu": True} if device.on_cpu else {}


def launch_on_cpu(ranks: int, gpus: int | None = None) -> bool:
    """Whether a launch of `ranks` ranks runs on the CPU with the GPUs hidden: fewer GPUs visible (`gpus`,
    `visible_gpus()` by default) than ranks, or LOADPOLICY_DEVICE=cpu. LOADPOLICY_DEVICE=cuda with too few is an
    error."""
    requested = requested_device()
    if requested == "cpu":
        return True
    count = visible_gpus() if gpus is None else gpus
    if requested == "cuda-shared":
        if not count:
            raise _too_few_gpus(1, count, "cuda-shared")
        return False
    if requested == "cuda" and count < ranks:
        raise _too_few_gpus(ranks, count)
    return count < ranks


def launch_device_env(on_cpu: bool) -> dict[str, str]:
    """What a launch adds to its environment: the GPUs hidden when it runs on the CPU, nothing otherwise."""
    return dict(HIDE_GPUS) if on_cpu else {}


def accelerate_device_lines(on_cpu: bool) -> list[str]:
    """The device lines of an `accelerate launch` config: `use_cpu: true` on the CPU only."""
    return ["use_cpu: true"] if on_cpu else []


def describe_launches(ranks: Iterable[int], gpus: int) -> str:
    """The one backend line of a run of launches of `ranks` ranks each, with `gpus` GPUs visible (as `launch_on_cpu`
    decides each launch)."""
    sizes = sorted(set(ranks))
    on_cpu = [size for size in sizes if launch_on_cpu(size, gpus)]
    visible = f"{gpus} GPU{'' if gpus == 1 else 's'} visible"
    hidden = 'GPUs hidden (CUDA_VISIBLE_DEVICES="")'
    if not on_cpu:
        return f"backend: {GPU_BACKEND}, one GPU per rank ({visible})"
    if requested_device() == "cpu":
        return f"backend: {CPU_BACKEND} on CPU, {hidden}: {DEVICE_ENV}=cpu"
    if not gpus:
        return f'backend: {CPU_BACKEND} on CPU, no GPU visible (every launch with CUDA_VISIBLE_DEVICES="")'
    if len(on_cpu) == len(sizes):
        return f"backend: {CPU_BACKEND} on CPU, {hidden}: {visible}, fewer than any launch's ranks"
    most = max(size for size in sizes if size not in on_cpu)
    return (
        f"backend: {GPU_BACKEND}, one GPU per rank, for launches of at most {most} ranks; {CPU_BACKEND} on CPU, "
        f"{hidden}, for launches of {', '.join(map(str, on_cpu))} ranks ({visible})"
    )


def to_device(batch: Any, device: Any) -> Any:
    """`batch` (a tensor, or a mapping of them) on `device` (a `RankDevice`, or a `torch.device` such as an engine's):
    the same tensor where it is there already."""
    target = device.device if isinstance(device, RankDevice) else device
    if isinstance(batch, Mapping):
        return {key: to_device(value, target) for key, value in batch.items()}
    return batch.to(target)


def host(tensor: Any) -> Any:
    """`tensor` detached, on the host: what is judged, saved as a result or read with `.numpy()` (no copy where it is
    on the CPU already)."""
    return tensor.detach().cpu()


def synchronize(device: RankDevice) -> None:
    """Wait for the work queued on `device` (a GPU runs it asynchronously) before a clock is read; nothing on the
    CPU."""
    if not device.on_cpu:
        import torch  # noqa: PLC0415  # optional: the `live` extra

        torch.cuda.synchronize(device.device)


def reset_device_peak(device: RankDevice) -> None:
    """Start `device_peak_bytes` afresh (GPU memory); nothing on the CPU, whose peak is the host's RSS
    (`procfs.PeakSampler`)."""
    if not device.on_cpu:
        import torch  # noqa: PLC0415  # optional: the `live` extra

        torch.cuda.reset_peak_memory_stats(device.device)


def device_peak_bytes(device: RankDevice) -> int | None:
    """The most GPU memory torch's allocator held on `device` since `reset_device_peak`; None on the CPU."""
    if device.on_cpu:
        return None
    import torch  # noqa: PLC0415  # optional: the `live` extra

    peak: int = torch.cuda.max_memory_allocated(device.device)
    return peak


class DeviceWindow:
    """A measured block on `device`, beside the host's `procfs.PeakSampler`: the device's peak reset on entry; on
    exit the work the block queued waited for (a clock read after it is the block's) and the peak read
    (`peak_bytes`, None on the CPU)."""

    def __init__(self, device: RankDevice) -> None:
        self.device = device
        self.peak_bytes: int | None = None

    def __enter__(self) -> DeviceWindow:
        reset_device_peak(self.device)
        return self

    def __exit__(self, *_: object) -> None:
        synchronize(self.device)
        self.peak_bytes = device_peak_bytes(self.device)
