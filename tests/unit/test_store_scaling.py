"""The store exchanges of a collective load (issue 62): the series' forms make a fixed number of requests per rank.

The shipped forms are the series' own text (`series_forms`: each function as the last patch adding it writes it), run
here over an in-memory store with TCPStore's semantics, one thread per rank; the forms before issue 62 are the
reference in `store_forms.py`. One small real run (W = 8, a real TCPStore) checks the simulation end to end.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from loadpolicy import policy
from loadpolicy.policy import LoadPolicyError
from loadpolicy.upstream.store_forms import (
    CountingStore,
    DistStoreError,
    Exchange,
    Forms,
    added_function,
    after,
    before,
    series_forms,
)
from loadpolicy.upstream.store_scaling import FAILURE, KINDS, Result, entry_for, judge, judge_record, work_for


PATCHES = Path(__file__).resolve().parents[2] / "patches"


class MemoryStore:
    """One store shared by every rank's thread: TCPStore's set/get/add/append/check/wait/multi_get, in memory."""

    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}
        self._changed = threading.Condition()

    def _put(self, key: str, value: bytes) -> None:
        with self._changed:
            self._values[key] = value
            self._changed.notify_all()

    def set(self, key: str, value: str | bytes) -> None:
        self._put(key, value.encode() if isinstance(value, str) else value)

    def get(self, key: str) -> bytes:
        with self._changed:
            return self._values[key]

    def add(self, key: str, amount: int) -> int:
        with self._changed:
            value = int(self._values.get(key, b"0")) + amount
            self._values[key] = str(value).encode()
            self._changed.notify_all()
            return value

    def append(self, key: str, value: str | bytes) -> None:
        with self._changed:
            self._put(key, self._values.get(key, b"") + (value.encode() if isinstance(value, str) else value))

    def check(self, keys: list[str]) -> bool:
        with self._changed:
            return all(key in self._values for key in keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: all(k in self._values for k in keys), timeout.total_seconds()):
                raise DistStoreError(f"wait timeout after {timeout}, keys: {keys}")

    def multi_get(self, keys: list[str]) -> list[bytes]:
        with self._changed:
            return [self._values[key] for key in keys]


@pytest.fixture(scope="module")
def forms() -> Forms:
    return series_forms(PATCHES)


def _run(world: int, work: Callable[[CountingStore, int], Any], ranks: range | None = None) -> list[Any]:
    """`work` on every rank (or only `ranks`) in threads over one MemoryStore: (store, result) per rank."""
    shared, ranks = MemoryStore(), ranks or range(world)
    stores = {rank: CountingStore(shared) for rank in ranks}
    results: dict[int, Result] = {}

    def rank_main(rank: int) -> None:
        try:
            results[rank] = Result(returned=work(stores[rank], rank))
        except Exception as error:
            results[rank] = Result(raised=error)

    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "an exchange did not return"
    return [(stores[rank], results[rank]) for rank in ranks]


def _exchange(forms: Forms, form: str) -> Exchange:
    return after(forms) if form == "after" else before(forms)


def _per_rank(forms: Forms, form: str, kind: str, world: int) -> tuple[int, int]:
    """The most requests, and the most keys named, by one rank in `kind` at `world` ranks; every result judged."""
    ran = _run(world, work_for(_exchange(forms, form), forms, policy, kind, world))
    assert judge(kind, world, [result for _, result in ran], LoadPolicyError) == []
    return max(store.total for store, _ in ran), max(store.keys for store, _ in ran)


@pytest.mark.parametrize("kind", KINDS)
def test_the_shipped_forms_make_a_fixed_number_of_requests_per_rank(forms: Forms, kind: str) -> None:
    at_8, at_32 = _per_rank(forms, "after", kind, 8), _per_rank(forms, "after", kind, 32)
    assert at_32[0] == at_8[0] <= 8
    if kind != KINDS[1]:  # a disagreement reads every rank's inputs: one multi_get naming W keys, on that path only
        assert at_32[1] == at_8[1] <= 8


@pytest.mark.parametrize("kind", KINDS)
def test_the_forms_before_issue_62_get_every_rank_s_key(forms: Forms, kind: str) -> None:
    (requests_8, keys_8), (requests_32, keys_32) = (_per_rank(forms, "before", kind, w) for w in (8, 32))
    assert requests_8 >= 8 + 2  # a set, a wait or check, then W gets
    assert requests_32 >= 32 + 2
    assert keys_32 - keys_8 >= 2 * (32 - 8)  # a wait or check of W keys, and W gets


def test_the_disagreement_costs_each_rank_one_multi_get(forms: Forms) -> None:
    ran = _run(8, work_for(after(forms), forms, policy, KINDS[1], 8))
    assert {store.requests["multi_get"] for store, _ in ran} == {1}
    assert {store.requests["get"] for store, _ in ran} == {0}
    assert all("zero3_enabled: rank 0=True" in str(result.raised) for _, result in ran)


@pytest.mark.parametrize("form", ["before", "after"])
def test_every_rank_hears_of_one_rank_s_failure(forms: Forms, form: str) -> None:
    ran = _run(8, work_for(_exchange(forms, form), forms, policy, KINDS[3], 8))
    assert [result.returned for _, result in ran] == [({4: FAILURE}, [])] * 8


@pytest.mark.parametrize("form", ["before", "after"])
def test_a_rank_that_never_reports_is_named_missing(forms: Forms, form: str) -> None:
    exchange = _exchange(forms, form)

    def work(store: CountingStore, rank: int) -> Any:
        return exchange.load_outcome(store, "outcome/", rank, 4, None, timedelta(seconds=0.2))

    assert [result.returned for _, result in _run(4, work, range(3))] == [({}, [3])] * 3


def test_the_judge_fails_a_rank_with_the_wrong_answer() -> None:
    right = Result(returned=({4: "OSError: x"}, []))
    assert judge(KINDS[2], 8, [Result(returned=({}, []))] * 8, LoadPolicyError) == []
    assert judge(KINDS[2], 8, [*[Result(returned=({}, []))] * 7, right], LoadPolicyError) == [
        "rank 7: " + repr(right.returned)
    ]
    assert judge(KINDS[0], 2, [Result(), None], LoadPolicyError) == ["rank 1: no result"]
    raised = Result(raised=LoadPolicyError("Ranks disagree on how to load (zero3_enabled: rank 0=True, rank 1=False)"))
    assert judge(KINDS[1], 2, [raised, raised], LoadPolicyError) == []
    assert judge(KINDS[1], 2, [raised, Result()], LoadPolicyError) == ["rank 1: None"]


def _record(seconds: list[float], **cell: Any) -> dict[str, Any]:
    cells = [
        {
            "world": 8,
            "form": form,
            "kind": kind,
            "seconds": seconds,
            "median_s": sorted(seconds)[len(seconds) // 2],
            "requests_per_rank": {"min": 4, "max": 5},
            "keys_per_rank_max": 5,
            "problems": [],
        }
        | cell
        for form in ("before", "after")
        for kind in KINDS
    ]
    return {"worlds": [8], "rounds": {"8": len(seconds)}, "cells": cells}


def test_the_record_judge_passes_a_whole_record_and_fails_nan_and_missing_fields() -> None:
    assert judge_record(_record([0.1, 0.3, 0.2])) == []
    assert any("finite positive" in p for p in judge_record(_record([0.1, math.nan, 0.2], median_s=0.2)))
    assert any("median" in p for p in judge_record(_record([0.1, 0.3, 0.2], median_s=math.nan)))
    assert any(
        "requests per rank" in p for p in judge_record(_record([0.1], requests_per_rank={"min": None, "max": 1}))
    )
    missing = _record([0.1])
    del missing["cells"][3]["seconds"]
    assert judge_record(missing) == ["record malformed: KeyError: 'seconds'"]
    short = _record([0.1])
    short["cells"].pop()
    assert judge_record(short) == [f"no cell for W=8 after {KINDS[-1]}"]
    assert any("2 rounds, not 3" in p for p in judge_record(_record([0.1, 0.2]) | {"rounds": {"8": 3}}))


def test_a_function_is_read_from_its_patch_as_it_is_added() -> None:
    text = "\n".join(
        [" context", "+def f(", "+    a,", "+) -> int:", "+    return a", "+", "+", "+def g():", "+    pass", ""]
    )
    assert added_function(text, "f") == "def f(\n    a,\n) -> int:\n    return a\n"
    assert added_function(text, "h") is None


def test_the_series_text_gives_both_exchanges_and_their_timeouts(forms: Forms) -> None:
    assert forms.timeouts["LOAD_POLICY_DISAGREEMENT_TIMEOUT"] == timedelta(seconds=10)
    assert forms.timeouts["LOAD_OUTCOME_TIMEOUT"] == timedelta(seconds=300)
    assert entry_for(policy, 64, 3, 3)["inputs"]["zero3_enabled"] is False  # type: ignore[index]


@pytest.mark.live
def test_a_real_tcp_store_at_8_ranks_passes_the_judge(forms: Forms) -> None:
    from loadpolicy.upstream.store_scaling import measure_world, start_server

    server = start_server()
    cells = measure_world(server.port, forms, policy, 8, 1, lambda _: None)
    assert judge_record({"worlds": [8], "rounds": {"8": 1}, "cells": cells}) == []
    assert {c["requests_per_rank"]["max"] for c in cells if c["form"] == "after"} <= set(range(4, 9))
