"""A launch: torchrun or `accelerate launch` on one tree, bounded, in its own session, with stage files per rank."""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import loadpolicy
from loadpolicy.errors import CommandError, positive_seconds
from loadpolicy_lab.harness.device import accelerate_device_lines, launch_device_env, launch_on_cpu
from loadpolicy_lab.harness.rank import Contract, RankFailure, parse, read_raw, transformers_file


OUR_SRC = Path(loadpolicy.__file__).resolve().parent.parent


class ValidationFailedError(CommandError):
    """A run did not behave as expected: a patched case failed, or a stock case passed that should fail."""


def progress(label: str, error: str | None, outcome: str = "", *, passed: bool = True) -> str:
    """A launch's line while a run goes: `ok LABEL: OUTCOME`, `!! LABEL: OUTCOME` where its judge failed, and
    `!! LABEL: FAILED: ERROR` where it has no outcome."""
    if error:
        return f"!! {label}: FAILED: {error}"
    return f"{'ok' if passed else '!!'} {label}: {outcome}"


class Tree(enum.StrEnum):
    STOCK = "stock"
    PATCHED = "patched"


# What stock 5.23.0 raises on every rank for EP under ZeRO-3 (gate 1 of the loading map): judges of stock runs match
# this text, so a timeout or a crash of the harness on stock is not taken for the bug.
STOCK_DEVICE_MAP_ERROR = "DeepSpeed Zero-3 is not compatible with passing a `device_map`"


class Launcher(enum.StrEnum):
    TORCHRUN = "torchrun"
    ACCELERATE = "accelerate"
    # one torchrun agent per rank, as on separate nodes (`harness/nodes.py`): a rank that dies stops no other
    NODES = "nodes"


def add_launch_arguments(parser: argparse.ArgumentParser, timeout: float) -> None:
    """--timeout (the bound on each launch), --patches (the series) and --cache (the sdist), as every command has."""
    parser.add_argument("--timeout", type=positive_seconds, default=timeout, help="bound on each launch, in seconds")
    parser.add_argument("--patches", type=Path, default=Path("patches"), help="series directory (default: patches)")
    parser.add_argument("--cache", type=Path, default=Path("build/cache"), help="sdist cache (default: build/cache)")


_HANDED_OUT: set[int] = set()
_PORTS = threading.Lock()


def free_port() -> int:
    """A port the kernel has just reported free and that no other launch of this process was given: launches run
    side by side (`harness/pool.py`), and the kernel may hand a closed port out again at once."""
    with _PORTS:
        while True:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port


def accelerate_config(path: Path, ranks: int, port: int, *, on_cpu: bool) -> Path:
    # What users of PR #45548 run: accelerate launch with DeepSpeed ZeRO-3 and zero3_init_flag on; the CPU line only
    # for a launch on the CPU (`harness.device.launch_on_cpu`).
    path.write_text(
        "\n".join(
            [
                "compute_environment: LOCAL_MACHINE",
                "distributed_type: DEEPSPEED",
                "deepspeed_config:",
                "  zero_stage: 3",
                "  zero3_init_flag: true",
                "  zero3_save_16bit_model: true",
                "  gradient_accumulation_steps: 1",
                "  offload_optimizer_device: none",
                "  offload_param_device: none",
                f"num_processes: {ranks}",
                "num_machines: 1",
                "machine_rank: 0",
                f"main_process_port: {port}",
                "mixed_precision: 'no'",
                *accelerate_device_lines(on_cpu),
                "",
            ]
        ),
        encoding="utf-8",
    )
    return path


def launch_command(launcher: Launcher, ranks: int, worker: list[str], out: Path, *, on_cpu: bool) -> list[str]:
    """The command line that starts `worker` (python arguments) on `ranks` processes with `launcher`, on the CPU or
    one GPU per rank (`on_cpu`)."""
    port = free_port()
    if launcher is Launcher.TORCHRUN:
        run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", f"--master-port={port}"]
        return [*run, *worker]
    if launcher is Launcher.NODES:
        return [sys.executable, "-m", "loadpolicy_lab.harness.nodes", str(ranks), str(port), *worker]
    config = accelerate_config(out / "accelerate.yaml", ranks, port, on_cpu=on_cpu)
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), *worker]


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a launch on `tree`: its `src` first on PYTHONPATH, then our package, offline."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(OUR_SRC)]),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
    }


def launch_env(tree: Path, ranks: int, env: Mapping[str, str] | None = None) -> tuple[dict[str, str], bool]:
    """The environment of a launch of `ranks` ranks on `tree`, and whether it runs on the CPU: the tree's, with the
    GPUs hidden where there are fewer than ranks (`harness.device.launch_on_cpu`: the one place that decides), then
    `env`."""
    on_cpu = launch_on_cpu(ranks)
    return tree_env(tree) | launch_device_env(on_cpu) | dict(env or {}), on_cpu


def run_bounded(command: list[str], env: dict[str, str], log: Path, timeout: float) -> int | None:
    """Run one bounded process (a generator, a reference): its exit code, or None when it was killed at the bound."""
    code, _ = _run_in_session(command, env, log, timeout)
    return code


class LaunchesStoppedError(RuntimeError):
    """A launch asked for after `stop_every_launch` (an interrupted validation)."""


# the process group of each launch running now, with the variable that marks every process of it
_SESSIONS: dict[int, str] = {}
_SESSIONS_LOCK = threading.Lock()
_STOPPING = threading.Event()


def stop_every_launch() -> None:
    """Kill the process group of every launch running (launcher and ranks) and refuse new ones: an interrupted run must
    not leave ranks behind, nor start the next launch of a case."""
    _STOPPING.set()
    with _SESSIONS_LOCK:
        sessions = list(_SESSIONS.items())
    for session, mark in sessions:
        _kill_launch(session, mark)


def _run_in_session(command: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int | None, bool]:
    """Run `command` in its own session; on timeout kill the whole group (launcher and ranks). Returns the exit code
    (None on timeout) and whether processes of the session outlived the launcher (killed since)."""
    if _STOPPING.is_set():
        raise LaunchesStoppedError(f"not started, every launch was stopped: {' '.join(command[:6])}")
    # torchrun's agent (and accelerate launch, which runs it) starts each rank in a session of its own, outside the
    # launcher's group: a variable of its own marks every process of this launch, whatever its session or parent
    mark = f"LOADPOLICY_LAUNCH_{uuid.uuid4().hex}"
    with (
        log.open("w", encoding="utf-8") as handle,
        subprocess.Popen(
            command, env={**env, mark: "1"}, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        ) as proc,
    ):
        with _SESSIONS_LOCK:
            _SESSIONS[proc.pid] = mark
        try:
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            left_running = code is not None and _outlived(proc.pid, mark)
            if code is None or left_running:
                _kill_launch(proc.pid, mark)
                proc.wait()
        except BaseException:  # interrupted: the launcher and its ranks go with this process
            _kill_launch(proc.pid, mark)
            raise
        finally:
            with _SESSIONS_LOCK:
                _SESSIONS.pop(proc.pid, None)
        return code, left_running


def _marked(mark: str) -> list[int]:
    """The live processes whose environment carries `mark` (a zombie's reads empty)."""
    return [int(pid) for pid in filter(str.isdigit, os.listdir("/proc")) if _carries(int(pid), mark)]


def _carries(pid: int, mark: str) -> bool:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as environ:
        return f"{mark}=1".encode() in environ.read().split(b"\0")
    return False


def _outlived(session: int, mark: str, grace: float = 2.0) -> bool:
    """Whether processes of the launch are still there `grace` seconds after its launcher exited: ranks that torchrun
    stopped as it closed may take a moment to go."""
    deadline = time.monotonic() + grace
    while _session_alive(session) or _marked(mark):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def _kill_launch(session: int, mark: str) -> None:
    """SIGKILL the launch's process group (launcher, node agents), then every process marked as the launch's: the
    ranks in sessions of their own, orphaned by their agent's death, until none is left. Each is signalled through a
    pidfd whose process still carries the mark, so a pid reused since the scan is never signalled."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(session, signal.SIGKILL)
    for _ in range(100):
        pids = _marked(mark)
        if not pids:
            return
        for pid in pids:
            _kill_marked(pid, mark)
        time.sleep(0.05)
    print(f"processes of a launch survived SIGKILL for 5 s: {_marked(mark)}", file=sys.stderr, flush=True)


def _kill_marked(pid: int, mark: str) -> None:
    try:
        handle = os.pidfd_open(pid)
    except OSError:  # gone already
        return
    try:
        if _carries(pid, mark):
            signal.pidfd_send_signal(handle, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(handle)


def _session_alive(session: int) -> bool:
    try:
        os.killpg(session, 0)
    except ProcessLookupError:
        return False
    return True


def stages(out: Path, ranks: int) -> str:
    where = []
    for rank in range(ranks):
        path = out / f"rank{rank}.stage"
        where.append(
            f"rank {rank} at {path.read_text(encoding='utf-8')!r}" if path.exists() else f"rank {rank}: no stage"
        )
    return ", ".join(where)


@dataclass(frozen=True, slots=True)
class Launched:
    """How a launch ended: its exit code (None when killed at the bound), its wall time, whether processes of it
    outlived the launcher, and where each rank was (its stage file)."""

    tree: Path
    out: Path
    ranks: int
    timeout: float
    returncode: int | None
    seconds: float
    left_running: bool
    attempts: int = 1  # 2 when another process took the first attempt's port (launcher.port-taken.log)

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def where(self) -> str:
        return stages(self.out, self.ranks)

    def timeout_message(self) -> str:
        return f"timed out after {self.timeout:.0f}s; {self.where()}"


def launch(
    module: str,
    spec: Mapping[str, object],
    tree: Path,
    out: Path,
    ranks: int,
    timeout: float,
    *,
    launcher: Launcher | None = None,
    env: Mapping[str, str] | None = None,
) -> Launched:
    """The one way every suite starts its ranks: write OUT/spec.json, clear the results of an earlier launch, run
    `python -m module SPEC OUT` on `ranks` processes with `launcher` (by default torchrun, or one plain process for
    one rank) on `tree`, bounded by `timeout` in its own session. `env` adds to the tree's environment."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.*"):
        stale.unlink()
    (out / "spec.json").write_text(json.dumps(spec, indent=2), encoding="utf-8")
    worker = ["-m", module, str(out / "spec.json"), str(out)]
    if launcher is None and ranks > 1:
        launcher = Launcher.TORCHRUN
    start = time.monotonic()
    code, left_running = _launch_once(worker, launcher, ranks, tree, out, timeout, env)
    attempts = 1
    if _port_taken(out, code):  # its log kept; the launch's bound covers both attempts
        (out / "launcher.log").rename(out / "launcher.port-taken.log")
        left = max(1.0, timeout - (time.monotonic() - start))
        code, left_running = _launch_once(worker, launcher, ranks, tree, out, left, env)
        attempts = 2
    return Launched(tree, out, ranks, timeout, code, time.monotonic() - start, left_running, attempts)


def _launch_once(
    worker: list[str],
    launcher: Launcher | None,
    ranks: int,
    tree: Path,
    out: Path,
    timeout: float,
    env: Mapping[str, str] | None,
) -> tuple[int | None, bool]:
    environment, on_cpu = launch_env(tree, ranks, env)
    command = [sys.executable, *worker]
    if launcher is not None:
        command = launch_command(launcher, ranks, worker, out, on_cpu=on_cpu)
    return _run_in_session(command, environment, out / "launcher.log", timeout)


def _port_taken(out: Path, code: int | None) -> bool:
    """The launcher could not listen on its port (another process took it between `free_port` and the launcher's
    bind) and no rank started: the launch is run again on another port."""
    if code in (0, None) or any(out.glob("rank*.*")):
        return False
    return "EADDRINUSE" in (out / "launcher.log").read_text(encoding="utf-8", errors="replace")


def read_results(launched: Launched, contract: type[Contract], suffix: str = ".json") -> list[Contract] | str:
    """Every rank's result of `launched` as `contract`, or why the launch did not give them: a rank that imported
    another transformers than the launch's tree's, a timeout, or the first rank that failed (where and why) with
    where every rank was."""
    out, ranks, timeout = launched.out, launched.ranks, launched.timeout
    code = launched.returncode
    raws = [read_raw(out / f"rank{rank}{suffix}") for rank in range(ranks)]
    src = launched.tree.resolve() / "src"
    elsewhere = [
        rank
        for rank, raw in enumerate(raws)
        if "error" not in raw and not Path(transformers_file(raw)).is_relative_to(src)
    ]
    if elsewhere:
        return f"ranks {elsewhere} imported transformers from outside {src}"
    parsed = [parse(raw, contract) for raw in raws]
    failed = [(rank, r) for rank, r in enumerate(parsed) if isinstance(r, RankFailure)]
    timed_out = f"timed out after {timeout:.0f}s; " if code is None else ""
    raised = [(rank, r) for rank, r in failed if r.stage]
    if raised:  # the rank that raised first names itself; torchrun stopped the others
        rank, failure = raised[0]
        return f"{timed_out}rank {rank} failed at {failure.stage!r}: {failure.error[:400]}; {stages(out, ranks)}"
    if failed:  # killed (out of memory, a signal) or stopped before it could write: where each rank was
        missing = [rank for rank, _ in failed]
        return (
            f"{timed_out}ranks {missing} wrote no result (launcher exit {code}: a rank killed, by the OOM killer "
            f"say); {stages(out, ranks)}; see {out / 'launcher.log'}"
        )
    return [r for r in parsed if not isinstance(r, RankFailure)]
