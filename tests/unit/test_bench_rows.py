"""The benchmark's rows and their summary over repeats, on synthetic rank measurements (real runs: `tox -e lab --
loadpolicy dev perf bench`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from loadpolicy_lab.perf.calibrate import measured_figures
from loadpolicy_lab.perf.contract import LoadMeasurement
from loadpolicy_lab.perf.rows import Kind, Row, load_row
from loadpolicy_lab.perf.run import CASES, render_table
from loadpolicy_lab.perf.writer import write


GIB = 1024**3


def measurement(rank: int, *, seconds: float, touch: float, initialize: float | None) -> LoadMeasurement:
    totals = ("rss_before", "peak_total", "held_total", "read_bytes", "read_bytes_loading", "rchar", "owned_bytes")
    memory: dict[str, Any] = dict.fromkeys(totals, GIB)
    halves = ("anon_before", "file_before", "peak_anon", "peak_file", "held_anon", "held_file")
    memory |= dict.fromkeys(halves, GIB // 2)
    return {  # type: ignore[typeddict-item]
        **memory,
        "rank": rank,
        "policy": "Zero3Init",
        "loading_branch": "zero3_read_partitions",
        "transformers_file": "/t/src/transformers/__init__.py",
        "unpartitioned": 0,
        "seconds": seconds,
        "touch_seconds": touch,
        "cpu_seconds": 1.0,
        "initialize_seconds": initialize,
        "initialize_peak_total": None if initialize is None else GIB,
        "fingerprinted": 3,
        "value_problems": [],
        "logits_problems": [],
        "logits_not_judged": None,
        **dict.fromkeys(("logits_error", "logits_bound", "logits_from_one_process", "logits_half_the_experts"), None),
    }


def _row(runs: list[list[LoadMeasurement]]) -> list[Row]:
    case = CASES[1]  # Zero3Init: partition reads
    tree = Path("/t")
    return [
        replace(load_row("tiny", case, 2, 2 * GIB, results, tree=tree, parameters=3), round=index)
        for index, results in enumerate(runs)
    ]


def test_until_trainable_is_the_slowest_rank_s_load_touch_and_initialize() -> None:
    first = [
        measurement(0, seconds=1.0, touch=0.5, initialize=2.0),
        measurement(1, seconds=1.5, touch=0.1, initialize=1),
    ]
    second = [
        measurement(0, seconds=1.0, touch=0.0, initialize=3.0),
        measurement(1, seconds=1.0, touch=0.0, initialize=1),
    ]
    rows = _row([first, second])
    assert [r.seconds for r in rows] == [pytest.approx(1.6), 1.0]
    assert [r.load_seconds for r in rows] == [1.5, 1.0]
    assert [r.trainable_seconds for r in rows] == [pytest.approx(3.5), 4.0]
    assert all(r.kind is Kind.LOAD and r.error is None for r in rows)
    table = render_table(rows)
    # load, + touch, + initialize: the median (min-max) over the two repeats
    seconds = "1.25 (1.00-1.50) | 1.30 (1.00-1.60) | 3.75 (3.50-4.00)"
    assert f"| tiny | Zero3Init: partition reads | 2 | {seconds} |" in table


def test_a_launch_without_zero3_has_no_until_trainable_figure() -> None:
    rows = _row([[measurement(r, seconds=1.0, touch=0.0, initialize=None) for r in range(2)]])
    assert rows[0].trainable_seconds is None
    assert "| 1.00 | 1.00 | - |" in render_table(rows)


def test_a_failed_repeat_fails_its_case_in_the_table() -> None:
    good = _row([[measurement(r, seconds=1.0, touch=0.0, initialize=None) for r in range(2)]])[0]
    bad = replace(good, round=1, error="rank 1 timed out", seconds=None)
    assert "FAILED: rank 1 timed out" in render_table([good, bad])


def test_the_written_json_is_what_calibration_reads(tmp_path: Path) -> None:
    """bench.json holds every launch; the calibration takes each case's median over them, minus the baseline."""
    rows = _row([[measurement(r, seconds=s, touch=0.0, initialize=None) for r in range(2)] for s in (1.0, 2.0, 3.0)])
    report = write(tmp_path, "bench", "text", rows, plot=False)  # the plot: `tox -e bench-smoke`, with matplotlib
    assert report.read_text(encoding="utf-8") == "text"
    launches = json.loads((tmp_path / "bench.json").read_text(encoding="utf-8"))
    assert [launch["round"] for launch in launches] == [0, 1, 2]
    own = measured_figures(launches)
    # peak 1 GiB over a 0.5 + 0.5 GiB baseline: nothing the model's own; anonymous 0.5 over 0.5
    assert own["peak total"] == pytest.approx(0.0)
    assert own["peak anonymous"] == pytest.approx(0.0)
