"""Launches side by side: the pool's order and bound, ports never handed out twice, shared references run once, and
which bad inputs the main job runs at 4 ranks."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from loadpolicy_lab.faults.cases import FAULT_CASES, fault_runs
from loadpolicy_lab.harness import launch
from loadpolicy_lab.harness.pool import run_all
from loadpolicy_lab.parity import run as parity_run


def test_results_come_back_in_the_order_of_the_jobs_and_no_more_run_at_once_than_asked() -> None:
    lock, running, most = threading.Lock(), [0], [0]

    def job(value: int, seconds: float) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(seconds)
        with lock:
            running[0] -= 1
        return value

    ended: list[int] = []
    jobs = [lambda v=v, s=s: job(v, s) for v, s in ((0, 1.0), (1, 0.01), (2, 0.05), (3, 0.01), (4, 0.01))]
    assert run_all(jobs, 2, lambda index, result: ended.append(index)) == [0, 1, 2, 3, 4]
    assert most[0] == 2
    assert sorted(ended) == [0, 1, 2, 3, 4]
    assert ended[-1] == 0  # the long first job ended last: the others did not wait for it


def test_jobs_that_wait_run_one_at_a_time_from_the_start_beside_the_others() -> None:
    lock = threading.Lock()
    running: set[int] = set()
    seen: list[frozenset[int]] = []

    def job(index: int, seconds: float) -> int:
        with lock:
            running.add(index)
            seen.append(frozenset(running))
        time.sleep(seconds)
        with lock:
            running.discard(index)
        return index

    waits = {4, 5}  # last in the order given, yet the first of them starts with the first computing jobs
    jobs = [lambda i=i: job(i, 0.3 if i in waits else 0.1) for i in range(6)]
    assert run_all(jobs, 2, lambda index, result: None, waiting=waits) == list(range(6))
    assert all(len(now - waits) <= 2 and len(now & waits) <= 1 for now in seen)
    assert any(4 in now and now & {0, 1} for now in seen)  # 4 ran beside the first two, not after them
    assert any(len(now) == 3 for now in seen)
    # one worker (a GPU per rank): no lane beside it, every job alone
    seen.clear()
    assert run_all(jobs, 1, lambda index, result: None, waiting=waits) == list(range(6))
    assert all(len(now) == 1 for now in seen)


def test_an_error_of_the_harness_starts_nothing_more_and_is_raised() -> None:
    started: list[int] = []

    def job(index: int) -> int:
        started.append(index)
        if index == 1:
            raise KeyError("a bug of the harness")
        return index

    with pytest.raises(KeyError, match="a bug of the harness"):
        run_all([lambda i=i: job(i) for i in range(6)], 1, lambda index, result: None)
    assert started == [0, 1]


def test_a_pool_of_no_worker_is_refused() -> None:
    with pytest.raises(ValueError, match="workers=0"):
        run_all([lambda: 1], 0, lambda index, result: None)


def test_a_port_is_never_handed_to_two_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    offered = iter([5001, 5001, 5002, 5001, 5003])

    class Socket:
        def __enter__(self) -> Socket:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def bind(self, _: object) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return "127.0.0.1", self.port

    monkeypatch.setattr(launch.socket, "socket", Socket)
    monkeypatch.setattr(launch, "_HANDED_OUT", set())
    assert [launch.free_port() for _ in range(3)] == [5001, 5002, 5003]


def test_a_launch_whose_port_was_taken_runs_again_on_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[list[str]] = []

    def run(command: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int | None, bool]:
        attempts.append(command)
        taken = "name: EADDRINUSE, message: address already in use" if len(attempts) == 1 else "ok"
        log.write_text(taken, encoding="utf-8")
        if len(attempts) > 1:
            (log.parent / "rank0.json").write_text("{}", encoding="utf-8")
        return (1 if len(attempts) == 1 else 0), False

    monkeypatch.setattr(launch, "_run_in_session", run)
    launched = launch.launch("some.worker", {}, tmp_path, tmp_path / "out", 2, 10.0)
    assert launched.returncode == 0
    assert launched.attempts == 2
    assert (tmp_path / "out" / "launcher.port-taken.log").read_text(encoding="utf-8").startswith("name: EADDRINUSE")
    ports = [next(arg for arg in command if arg.startswith("--master-port=")) for command in attempts]
    assert len(ports) == 2
    assert ports[0] != ports[1]


def test_a_launch_that_failed_otherwise_is_not_run_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[list[str]] = []

    def run(command: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int | None, bool]:
        attempts.append(command)
        log.write_text("EADDRINUSE", encoding="utf-8")
        (log.parent / "rank0.stage").write_text("loading", encoding="utf-8")  # a rank started: not the port
        return 1, False

    monkeypatch.setattr(launch, "_run_in_session", run)
    assert launch.launch("some.worker", {}, tmp_path, tmp_path / "out", 2, 10.0).returncode == 1
    assert len(attempts) == 1


def test_cases_training_the_same_way_side_by_side_run_their_reference_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[Path] = []

    def run_mode(*args: Any) -> None:
        runs.append(args[5])
        time.sleep(0.1)  # the second case asks while the first one's reference is still running

    monkeypatch.setattr(parity_run, "_run_mode", run_mode)
    spec: Any = {"distributed_reference": False, "steps": 3}
    references: dict[str, Path] = {}
    got: list[tuple[Path, str | None]] = []
    threads = [
        threading.Thread(target=lambda d=d: got.append(parity_run._reference(spec, 2, tmp_path, d, 10.0, references)))
        for d in (tmp_path / "a", tmp_path / "b")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(runs) == 1
    assert [directory for directory, _ in got] == [runs[0], runs[0]]


def test_the_main_job_runs_at_4_ranks_the_bad_inputs_whose_outcome_can_depend_on_it() -> None:
    main = fault_runs(fast=False, sweep=False)
    assert {case.name for case, ranks in main if ranks == 2} == {case.name for case in FAULT_CASES}
    at_four = {case.name for case, ranks in main if ranks == 4}
    assert at_four == {case.name for case in FAULT_CASES if not case.same_at_any_world_size}
    # those whose view differs by rank, or that kill or wait on a rank, always run at 4 ranks too
    assert all(not case.same_at_any_world_size for case in FAULT_CASES if case.bad_rank or case.others_end)
    assert {(c.name, r) for c, r in fault_runs(fast=False, sweep=True)} == {
        (case.name, ranks) for case in FAULT_CASES for ranks in (2, 4)
    }
    assert {r for _, r in fault_runs(fast=True, sweep=False)} == {2}


def test_an_interrupted_pool_stops_every_launch_and_starts_no_other() -> None:
    started: list[int] = []
    stopped = threading.Event()

    def job(index: int) -> int:
        started.append(index)
        if index:
            stopped.wait(5)  # a launch running until `stop` kills it
        return index

    def done(index: int, result: int) -> None:
        raise KeyboardInterrupt  # Ctrl-C reaches the main thread, which reports the runs as they end

    with pytest.raises(KeyboardInterrupt):
        run_all([lambda i=i: job(i) for i in range(4)], 2, done, stopped.set)
    assert stopped.is_set()
    assert 0 in started
    assert set(started) <= {0, 1}  # the one beside it, if it had started; no other


def test_a_stopped_harness_refuses_new_launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "_STOPPING", threading.Event())
    launch.stop_every_launch()
    with pytest.raises(launch.LaunchesStoppedError, match="every launch was stopped"):
        launch.launch("some.worker", {}, tmp_path, tmp_path / "out", 2, 10.0)
