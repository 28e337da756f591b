"""`harness.launch.launch` and `read_results` on a real one-process launch: a fake tree, `transformers` a stub."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import TypedDict

import pytest

from loadpolicy_lab.harness.launch import launch, read_results


class Answer(TypedDict):
    answer: int


WORKER = textwrap.dedent(
    """
    import transformers
    from loadpolicy_lab.harness.rank import run_rank

    def body(rank, spec):
        rank.facts["transformers_file"] = transformers.__file__
        if spec["fail"]:
            rank.stage("thinking")
            raise ValueError("no answer")
        return {"answer": 42} if spec["complete"] else {}

    run_rank(body, dict)
    """
)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "tree" / "src"
    (src / "transformers").mkdir(parents=True)
    (src / "transformers" / "__init__.py").write_text("", encoding="utf-8")
    (src / "fake_worker.py").write_text(WORKER, encoding="utf-8")
    return tmp_path / "tree"


def run(tree: Path, out: Path, *, fail: bool = False, complete: bool = True) -> list[Answer] | str:
    return read_results(launch("fake_worker", {"fail": fail, "complete": complete}, tree, out, 1, 60.0), Answer)


def test_a_complete_result_comes_back_as_its_contract(tree: Path, tmp_path: Path) -> None:
    assert run(tree, tmp_path / "ok") == [
        {"answer": 42, "transformers_file": str(tree / "src/transformers/__init__.py")}
    ]


def test_a_failed_rank_is_named_with_where_and_why(tree: Path, tmp_path: Path) -> None:
    error = run(tree, tmp_path / "fail", fail=True)
    assert isinstance(error, str)
    assert error.startswith("rank 0 failed at 'thinking': ValueError: no answer")


def test_a_result_missing_a_field_fails_naming_it(tree: Path, tmp_path: Path) -> None:
    error = run(tree, tmp_path / "partial", complete=False)
    assert isinstance(error, str)
    assert "result lacks ['answer'] (a Answer)" in error


def test_a_rank_that_imported_another_transformers_fails(tree: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    (other / "src").mkdir(parents=True)
    (other / "src" / "fake_worker.py").write_text(WORKER, encoding="utf-8")
    # no transformers in this tree: the rank is handed one from outside it (as a stale install would)
    (other / "elsewhere_transformers.py").write_text("", encoding="utf-8")
    (other / "src" / "sitecustomize.py").write_text(
        f"import sys; sys.path.insert(0, {str(other)!r}); import elsewhere_transformers; "
        "sys.modules['transformers'] = elsewhere_transformers",
        encoding="utf-8",
    )
    error = run(other, tmp_path / "elsewhere")
    assert isinstance(error, str)
    assert "imported transformers from outside" in error


def test_a_rank_killed_before_it_wrote_says_so(tree: Path, tmp_path: Path) -> None:
    (tree / "src" / "killed_worker.py").write_text("import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n")
    error = read_results(launch("killed_worker", {}, tree, tmp_path / "killed", 1, 60.0), Answer)
    assert isinstance(error, str)
    assert error.startswith("ranks [0] wrote no result (launcher exit -9")


def test_a_process_left_running_after_the_launcher_exits_is_reported_and_killed(tree: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "orphan.pid"
    (tree / "src" / "leaves_a_child.py").write_text(
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n",
        encoding="utf-8",
    )
    launched = launch("leaves_a_child", {}, tree, tmp_path / "orphan", 1, 60.0)
    assert launched.returncode == 0
    assert launched.left_running
    orphan = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{orphan}").exists() or "Z" in Path(f"/proc/{orphan}/stat").read_text().split()[2]


def test_a_launch_past_its_bound_is_killed_and_says_where_each_rank_was(tree: Path, tmp_path: Path) -> None:
    (tree / "src" / "sleeper.py").write_text(
        "import sys, pathlib, time\npathlib.Path(sys.argv[2], 'rank0.stage').write_text('sleeping')\ntime.sleep(60)\n",
        encoding="utf-8",
    )
    launched = launch("sleeper", {}, tree, tmp_path / "slow", 1, 3.0)
    assert launched.timed_out
    assert launched.seconds < 30
    assert launched.timeout_message() == "timed out after 3s; rank 0 at 'sleeping'"


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_ranks_in_sessions_of_their_own_go_with_a_launch_past_its_bound(tree: Path, tmp_path: Path) -> None:
    """torchrun's agent starts each rank in a session of its own: killing the launcher's group alone leaves it."""
    pid_file = tmp_path / "rank.pid"
    (tree / "src" / "own_session.py").write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(120)\n",
        encoding="utf-8",
    )
    launched = launch("own_session", {}, tree, tmp_path / "own", 1, 3.0)
    assert launched.timed_out
    time.sleep(0.2)
    assert _gone(int(pid_file.read_text()))


def test_a_process_in_a_session_of_its_own_left_after_the_launcher_exits_is_killed(tree: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "left.pid"
    (tree / "src" / "leaves_a_session.py").write_text(
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n",
        encoding="utf-8",
    )
    launched = launch("leaves_a_session", {}, tree, tmp_path / "left", 1, 60.0)
    assert launched.left_running
    time.sleep(0.2)
    assert _gone(int(pid_file.read_text()))
