"""The benchmark's row figures, on synthetic rank measurements (real runs: `tox -e lab -- loadpolicy dev perf
bench`)."""

from __future__ import annotations

from typing import Any

import pytest

from loadpolicy_lab.models.bench import SMOKE
from loadpolicy_lab.perf.contract import LoadMeasurement
from loadpolicy_lab.perf.run import CASES, _row


GIB = 1024**3


def measurement(rank: int, *, seconds: float, touch: float, initialize: float | None) -> LoadMeasurement:
    memory: dict[str, Any] = dict.fromkeys(
        (
            "rss_before",
            "anon_before",
            "file_before",
            "peak_anon",
            "peak_file",
            "peak_total",
            "held_anon",
            "held_total",
        ),
        GIB,
    )
    return {  # type: ignore[typeddict-item]
        **memory,
        "rank": rank,
        "policy": "Zero3Init",
        "loading_branch": "zero3_read_partitions",
        "transformers_file": "tf/src/transformers/__init__.py",
        "unpartitioned": 0,
        "seconds": seconds,
        "touch_seconds": touch,
        "cpu_seconds": 1.0,
        "initialize_seconds": initialize,
        "held_file": 0,
        "read_bytes": GIB,
        "read_bytes_loading": GIB,
        "rchar": GIB,
        "owned_bytes": GIB,
    }


def test_ready_to_train_is_the_slowest_rank_s_load_touch_and_initialize() -> None:
    first = [
        measurement(0, seconds=1.0, touch=0.5, initialize=2.0),
        measurement(1, seconds=1.5, touch=0.1, initialize=1),
    ]
    second = [
        measurement(0, seconds=1.0, touch=0.0, initialize=3.0),
        measurement(1, seconds=1.0, touch=0.0, initialize=1),
    ]
    runs = [first, second]
    row = _row(SMOKE[1], 1000, CASES[0], 2, runs)
    assert row.ready_seconds["median"] == pytest.approx((1.6 + 1.0) / 2)
    assert row.initialized_seconds == {"median": pytest.approx(3.75), "min": 3.5, "max": 4.0}


def test_a_launch_without_zero3_has_no_initialize_figure() -> None:
    runs = [[measurement(r, seconds=1.0, touch=0.0, initialize=None) for r in range(2)]]
    assert _row(SMOKE[1], 1000, CASES[0], 2, runs).initialized_seconds == {}
