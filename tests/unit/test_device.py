"""`harness.device`, the one place a launch's device and backend are decided: the choice on each side of a launch,
where a collective's tensors live, what the workers hand accelerate and the Trainer; and that no other module of the
package decides them itself. Pure logic: CUDA is monkeypatched, no process starts."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest


torch = pytest.importorskip("torch")

import loadpolicy  # noqa: E402
from loadpolicy_lab.harness import device as dev  # noqa: E402
from loadpolicy_lab.harness.launch import Launcher, accelerate_config, launch_command, launch_env  # noqa: E402


PACKAGE = Path(loadpolicy.__file__).parent
CPU = dev.RankDevice(torch.device("cpu"), "gloo")
GPU = dev.RankDevice(torch.device("cuda", 1), "nccl")


def _never(device_type: str) -> int:
    raise AssertionError(f"asked for the current {device_type} device of a group a CPU backend serves")


@pytest.mark.parametrize("config", ["cpu:gloo,cuda:gloo", "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo", "cpu:gloo"])
def test_a_group_with_a_cpu_backend_collects_on_the_cpu(config: str) -> None:
    assert dev.collective_device_for(config, _never) == torch.device("cpu")


@pytest.mark.parametrize(("config", "device_type"), [("cuda:nccl", "cuda"), ("xpu:xccl", "xpu"), ("hpu:hccl", "hpu")])
def test_a_device_only_backend_collects_on_the_current_device_of_its_type(config: str, device_type: str) -> None:
    asked: list[str] = []

    def current(kind: str) -> int:
        asked.append(kind)
        return 3

    assert dev.collective_device_for(config, current) == torch.device(device_type, 3)
    assert asked == [device_type]


@pytest.mark.parametrize("config", ["", "nccl", "cuda:", ":nccl", "cpu:gloo,,cuda:nccl"])
def test_a_backend_config_that_is_not_device_backend_pairs_is_refused(config: str) -> None:
    with pytest.raises(ValueError, match="is not DEVICE:BACKEND"):
        dev.collective_device_for(config, _never)


@dataclass
class Cuda:
    """What the monkeypatched CUDA reports: `count` GPUs (none: not available); the devices made current."""

    count: int = 0
    made_current: list[int] = field(default_factory=list)


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> Cuda:
    """CUDA with as many GPUs as the test sets, in a rank and as the runner counts them (in a child process, here
    monkeypatched), `set_device` recorded; no LOADPOLICY_DEVICE, LOCAL_RANK or CUDA_VISIBLE_DEVICES from the
    environment the tests run in."""
    cuda = Cuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda.count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda.count)
    monkeypatch.setattr(torch.cuda, "set_device", cuda.made_current.append)
    monkeypatch.setattr(dev, "visible_gpus", lambda: cuda.count)
    for name in (dev.DEVICE_ENV, "LOCAL_RANK", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    return cuda


def test_each_rank_with_a_gpu_of_its_own_takes_it_with_nccl(gpus: Cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus.count = 2
    assert dev.rank_device(1) == dev.RankDevice(torch.device("cuda", 1), "nccl")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert dev.rank_device() == dev.RankDevice(torch.device("cuda", 0), "nccl")
    assert gpus.made_current == [1, 0]


def test_a_rank_without_a_gpu_of_its_own_runs_on_the_cpu_with_gloo(gpus: Cuda) -> None:
    assert dev.rank_device(0) == CPU  # no GPU
    gpus.count = 2
    assert dev.rank_device(2) == CPU  # the third rank of a launch on two GPUs
    assert gpus.made_current == []


def test_loadpolicy_device_cpu_keeps_every_rank_on_the_cpu(gpus: Cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus.count = 4
    monkeypatch.setenv(dev.DEVICE_ENV, "cpu")
    assert dev.rank_device(0) == CPU
    assert gpus.made_current == []
    monkeypatch.setenv(dev.DEVICE_ENV, "")  # empty: as unset
    assert dev.rank_device(0).backend == "nccl"


def test_loadpolicy_device_cuda_without_a_gpu_for_the_rank_is_an_error(
    gpus: Cuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus.count = 1
    monkeypatch.setenv(dev.DEVICE_ENV, "cuda")
    assert dev.rank_device(0).device == torch.device("cuda", 0)
    with pytest.raises(
        dev.DeviceChoiceError, match=r"LOADPOLICY_DEVICE=cuda .*2 needed, 1 visible; accepted: cpu, cuda"
    ):
        dev.rank_device(1)


def test_an_unknown_loadpolicy_device_is_refused_naming_it_and_the_accepted_values(
    gpus: Cuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(dev.DEVICE_ENV, "gpu")
    with pytest.raises(
        dev.DeviceChoiceError, match=r"LOADPOLICY_DEVICE='gpu'; accepted: cpu, cuda, cuda-shared, or unset"
    ):
        dev.rank_device(0)
    with pytest.raises(dev.DeviceChoiceError, match="'gpu'"):
        dev.launch_on_cpu(2, gpus=4)


def test_a_launch_with_fewer_gpus_than_ranks_hides_them(gpus: Cuda, tmp_path: Path) -> None:
    gpus.count = 1
    env, on_cpu = launch_env(tmp_path, 2)
    assert on_cpu
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["OMP_NUM_THREADS"] == "1"  # the tree's environment still


def test_a_launch_with_a_gpu_per_rank_leaves_them_visible(gpus: Cuda, tmp_path: Path) -> None:
    gpus.count = 2
    env, on_cpu = launch_env(tmp_path, 2)
    assert not on_cpu
    assert "CUDA_VISIBLE_DEVICES" not in env
    env, on_cpu = launch_env(tmp_path, 4)  # the same machine, a launch of more ranks
    assert on_cpu
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert launch_env(tmp_path, 2, {"CUDA_VISIBLE_DEVICES": "1,0"})[0]["CUDA_VISIBLE_DEVICES"] == "1,0"


def test_loadpolicy_device_decides_the_launch_too(gpus: Cuda, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus.count = 4
    monkeypatch.setenv(dev.DEVICE_ENV, "cpu")
    env, on_cpu = launch_env(tmp_path, 2)
    assert on_cpu
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    monkeypatch.setenv(dev.DEVICE_ENV, "cuda")
    assert not launch_env(tmp_path, 4)[1]
    with pytest.raises(dev.DeviceChoiceError, match="8 needed, 4 visible"):
        launch_env(tmp_path, 8)


def test_the_runner_counts_the_gpus_its_ranks_see_without_importing_torch_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dev.visible_gpus.cache_clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what a hidden launch's ranks see: none, on any machine
    try:
        assert dev.visible_gpus() == 0
    finally:
        dev.visible_gpus.cache_clear()
    script = dev._COUNT_GPUS.replace("import torch", "import torch_that_is_not_installed")
    counted = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert counted.stdout.strip() == "0"  # without torch no rank has CUDA
    runner = (
        "import sys; from loadpolicy_lab.harness import device; device.visible_gpus(); print('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    imported = subprocess.run([sys.executable, "-c", runner], capture_output=True, text=True, check=True, env=env)
    assert imported.stdout.strip() == "False"


def test_the_backend_line_says_which_launches_get_a_gpu_per_rank(gpus: Cuda) -> None:
    ranks = [2, 2, 4, 2]
    assert dev.describe_launches(ranks, 4) == "backend: nccl, one GPU per rank (4 GPUs visible)"
    mixed = dev.describe_launches(ranks, 2)
    assert mixed.startswith("backend: nccl, one GPU per rank, for launches of at most 2 ranks; gloo on CPU")
    assert 'GPUs hidden (CUDA_VISIBLE_DEVICES=""), for launches of 4 ranks' in mixed
    assert dev.describe_launches(ranks, 1) == (
        'backend: gloo on CPU, GPUs hidden (CUDA_VISIBLE_DEVICES=""): 1 GPU visible, fewer than any launch\'s ranks'
    )
    assert 'gloo on CPU, no GPU visible (every launch with CUDA_VISIBLE_DEVICES="")' in dev.describe_launches(ranks, 0)


def test_the_accelerate_config_asks_for_the_cpu_only_on_the_cpu(tmp_path: Path) -> None:
    assert dev.accelerate_device_lines(True) == ["use_cpu: true"]
    assert dev.accelerate_device_lines(False) == []
    on_cpu = accelerate_config(tmp_path / "cpu.yaml", 2, 29500, on_cpu=True).read_text(encoding="utf-8")
    assert "use_cpu: true" in on_cpu.splitlines()
    command = launch_command(Launcher.ACCELERATE, 2, ["-m", "worker"], tmp_path, on_cpu=False)
    config = Path(command[command.index("--config_file") + 1]).read_text(encoding="utf-8")
    assert "use_cpu" not in config
    assert "distributed_type: DEEPSPEED" in config


def test_the_trainer_is_told_use_cpu_only_on_the_cpu() -> None:
    assert dev.training_args_device_kwargs(CPU) == {"use_cpu": True}
    assert dev.training_args_device_kwargs(GPU) == {}


def test_accelerate_is_told_to_start_gloo_only_on_the_cpu() -> None:
    pytest.importorskip("accelerate")
    (handler,) = dev.accelerator_kwargs_handlers(CPU)
    assert handler.backend == "gloo"
    assert dev.accelerator_kwargs_handlers(GPU) == []


def test_results_come_back_to_the_host_and_inputs_go_to_the_device() -> None:
    weight = torch.ones(3, requires_grad=True)
    back = dev.host(weight * 2)
    assert back.device == torch.device("cpu")
    assert not back.requires_grad
    ids = torch.arange(4)
    assert dev.to_device(ids, CPU) is ids  # on the CPU already: the same tensor, no copy
    assert dev.to_device(ids, torch.device("meta")).device == torch.device("meta")
    moved = dev.to_device({"input_ids": ids, "labels": ids}, dev.RankDevice(torch.device("meta"), "fake"))
    assert {value.device.type for value in moved.values()} == {"meta"}


def test_clocks_and_peaks_wait_for_a_gpu_and_never_touch_cuda_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: calls.append(f"synchronize {device}"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(f"reset {device}"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 7 << 20)
    with dev.DeviceWindow(CPU) as window:
        pass
    assert window.peak_bytes is None
    assert dev.device_peak_bytes(CPU) is None
    assert calls == []
    with dev.DeviceWindow(GPU) as window:
        calls.append("work")
    assert calls == ["reset cuda:1", "work", "synchronize cuda:1"]
    assert window.peak_bytes == 7 << 20


# --- the guard: nothing else in the package decides the device or the backend ---------------------------------------

DECIDES = PACKAGE.parent / "loadpolicy_lab" / "harness" / "device.py"
UPSTREAM = PACKAGE / "upstream"  # the series' tooling, which runs transformers' own tests
NEEDLES = ("init_process_group(", "dist_backend=", "use_cpu=True", "use_cpu: true", "InitProcessGroupKwargs(")
BACKENDS = {"gloo", "nccl"}


def _hard_coded(text: str) -> list[str]:
    """Where `text` (a module's source) picks a device or backend itself: a call or setting in `NEEDLES`, or a
    backend's name as a string literal of its own."""
    found = [needle for needle in NEEDLES if needle in text]
    found += [
        f"line {node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Constant) and node.value in BACKENDS
    ]
    return found


@pytest.mark.parametrize(
    "source",
    [
        'torch.distributed.init_process_group("gloo")',
        "deepspeed.init_distributed(dist_backend=backend)",
        "backend = 'nccl' if cuda else 'gloo'",
        "TrainingArguments(out, use_cpu=True)",
        'CONFIG = "mixed_precision: no\\nuse_cpu: true\\n"',
        "Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend=b)])",
    ],
)
def test_the_guard_sees_a_device_chosen_by_hand(source: str) -> None:
    assert _hard_coded(source)


def test_the_guard_lets_prose_and_the_devices_helpers_pass() -> None:
    assert _hard_coded('print("backend: gloo on CPU")\nstart_process_group(device)\nhelper(use_cpu=flag)') == []


def test_only_harness_device_picks_a_device_or_a_backend() -> None:
    src = PACKAGE.parent  # the product and the lab
    modules = [p for p in sorted(src.rglob("*.py")) if p != DECIDES and not p.is_relative_to(UPSTREAM)]
    assert len(modules) > 50
    found = {str(path.relative_to(src)): hits for path in modules if (hits := _hard_coded(path.read_text("utf-8")))}
    assert found == {}
    assert _hard_coded(DECIDES.read_text(encoding="utf-8"))  # the one place, where the guard would see them


def test_loadpolicy_device_cuda_shared_puts_every_rank_on_the_first_gpu_with_gloo(
    gpus: Cuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a one-GPU machine's multi-rank check: gloo between the ranks, every tensor on cuda:0
    gpus.count = 1
    monkeypatch.setenv(dev.DEVICE_ENV, "cuda-shared")
    assert dev.rank_device(3) == dev.RankDevice(torch.device("cuda", 0), "gloo")
    assert gpus.made_current == [0]
    assert dev.launch_on_cpu(4) is False  # the GPU stays visible to four ranks
    gpus.count = 0
    with pytest.raises(dev.DeviceChoiceError, match=r"LOADPOLICY_DEVICE=cuda-shared needs a GPU .*0 visible"):
        dev.rank_device(0)
    with pytest.raises(dev.DeviceChoiceError, match=r"cuda-shared"):
        dev.launch_on_cpu(2)
