"""`loadpolicy dev gpu --on-cpu`: the GPU check's own cases run on the CPU (gloo), so that the command a GPU machine
runs is exercised where CI runs: an EP load of two ranks sharing one device and the read benchmark, each judged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
CASES = ("epmeta-w2-shared", "read")
TIMEOUT_S = 900


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("gpu")
    command = [sys.executable, "-m", "loadpolicy", "dev", "gpu", "--on-cpu", "--out", str(out)]
    command += [f"--case={case}" for case in CASES]
    command += ["--cache", str(ROOT / "build" / "cache"), "--timeout", "300"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "gpu.md").exists()
    loaded: dict[str, object] = json.loads((out / "gpu.json").read_text(encoding="utf-8"))
    return loaded


def test_every_case_ran_on_the_cpu_and_passed_its_judge(report: dict[str, object]) -> None:
    rows = report["rows"]
    assert isinstance(rows, list)
    assert [row["case"] for row in rows] == list(CASES)
    assert [row["error"] for row in rows] == [None, None]
    assert all(row["device"].startswith("cpu") for row in rows)
    assert report["on_cpu"] is True


def test_the_ep_case_trained_like_one_device_and_the_read_case_timed_every_way(report: dict[str, object]) -> None:
    ep, read = report["rows"]  # type: ignore[misc]
    assert 0 <= ep["trained_max_diff"] <= ep["bound"] == 1e-5
    assert set(read["read_gbps"]) == {"pipeline", "preadv + copy", "copy alone"}
    assert all(rate > 0 for rate in read["read_gbps"].values())
