"""`harness.launch.launch_worker` on a real one-process launch: a fake tree whose `transformers` is a stub package."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TypedDict

import pytest

from loadpolicy.harness.launch import launch_worker


class Answer(TypedDict):
    answer: int


WORKER = textwrap.dedent(
    """
    import transformers
    from loadpolicy.harness.rank import run_rank

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
    return launch_worker("fake_worker", {"fail": fail, "complete": complete}, tree, out, 1, 60.0, Answer)


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
    error = launch_worker("killed_worker", {}, tree, tmp_path / "killed", 1, 60.0, Answer)
    assert isinstance(error, str)
    assert error.startswith("ranks [0] wrote no result (launcher exit -9")
