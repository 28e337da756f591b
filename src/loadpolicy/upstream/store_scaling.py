"""`loadpolicy dev store-scaling`: the store exchanges of a collective load at W = 8 to 1,024 ranks, on one machine.

One real `torch.distributed.TCPStore` server (the libuv backend, as torchrun's agent store), W clients each on its
own connection, each in a thread of this process: the exchanges block in the store (which releases the GIL), and
1,024 processes would each import torch. Per W, in rounds that alternate which form goes first, each form (the
reference before issue 62, and the one the tree ships, `store_forms.py`) runs four exchanges under a fresh key
prefix: the agreement (every rank agrees), the agreement with one rank's inputs differing, the load outcome (every
rank loaded), the load outcome with one rank failed. Each exchange is timed from the moment the ranks are released
together until the last rank returns, each rank's requests are counted, and every rank's result is judged.
"""

from __future__ import annotations

import inspect
import math
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from loadpolicy.upstream.store_forms import (
    AGREEMENT_FUNCTIONS,
    LOAD_OUTCOME_FUNCTIONS,
    CountingStore,
    Exchange,
    Forms,
    added_function,
    after,
    before,
)


KINDS = ("agreement", "agreement, one rank differs", "load outcome", "load outcome, one rank failed")
FORMS = ("before", "after")
FAILURE = "OSError: /checkpoints/model-00007-of-00016.safetensors is truncated: 1310720 of 4287654912 bytes read"
JOIN_TIMEOUT_S = 900.0
Work = Callable[[CountingStore, int], Any]


@dataclass(frozen=True)
class Result:
    """One rank's end of one exchange: what it returned, or the error it raised."""

    returned: Any = None
    raised: BaseException | None = None


def entry_for(policy: Any, world: int, rank: int, differing: int | None) -> dict[str, object]:
    """The agreement's entry of `rank` in an EPMeta launch (ZeRO-3, ep = 8, fsdp = W), built with the tree's own
    `LoadInputs` and `inputs_as_dict`; the `differing` rank did not see the ZeRO-3 config."""
    sizes = policy.ParallelSizes(ep=min(8, world), fsdp=world)
    inputs = policy.LoadInputs(zero3_enabled=rank != differing, sizes=sizes)
    return {"inputs": policy.inputs_as_dict(inputs), "index": 0}


def work_for(exchange: Exchange, forms: Forms, policy: Any, kind: str, world: int) -> Work:
    """What each rank calls in exchange `kind`: the odd one out is rank W // 2."""
    odd = world // 2
    if kind.startswith("agreement"):
        differing = odd if kind == KINDS[1] else None
        entries = [entry_for(policy, world, rank, differing) for rank in range(world)]
        return lambda store, rank: exchange.agree(store, 0, rank, world, entries[rank])
    failing = odd if kind == KINDS[3] else None
    notice, bound = forms.timeouts["LOAD_FAILURE_NOTICE_TIMEOUT"], forms.timeouts["LOAD_OUTCOME_TIMEOUT"]

    def outcome(store: CountingStore, rank: int) -> Any:
        error = FAILURE if rank == failing else None
        timeout = notice if error is not None else bound
        return exchange.load_outcome(store, "transformers/load_outcome/0/", rank, world, error, timeout)

    return outcome


def judge(kind: str, world: int, results: Sequence[Result | None], error: type[Exception]) -> list[str]:
    """Every rank's result is the exchange's right answer: all agree, all raise the disagreement naming the odd
    rank's input, all see every rank loaded, all see exactly the odd rank's failure."""
    odd, problems = world // 2, []
    for rank, result in enumerate(results):
        if result is None:
            problems.append(f"rank {rank}: no result")
            continue
        if kind == KINDS[1]:
            text = str(result.raised)
            ok = isinstance(result.raised, error) and "zero3_enabled" in text and f"rank {odd}=False" in text
        elif result.raised is not None:
            ok = False
        elif kind == KINDS[0]:
            ok = result.returned is None
        else:
            expected: tuple[dict[int, str], list[int]] = ({odd: FAILURE} if kind == KINDS[3] else {}, [])
            ok = tuple(result.returned) == expected
        if not ok:
            problems.append(
                f"rank {rank}: {result.raised!r}" if result.raised else f"rank {rank}: {result.returned!r}"
            )
    return problems[:3] + ([f"... {len(problems) - 3} more"] if len(problems) > 3 else [])


def run_ranks(clients: Sequence[Any], prefix: str, work: Work) -> tuple[float, list[Result | None], list[int], int]:
    """Every rank's `work` on its own client under `prefix`, in its own thread, released together: the seconds from
    the release to the last return, each rank's result, each rank's request count, the most keys one rank named."""
    import torch.distributed  # noqa: PLC0415  # optional: the `live` extra

    stores = [CountingStore(torch.distributed.PrefixStore(prefix, client)) for client in clients]
    world = len(clients)
    results: list[Result | None] = [None] * world
    starts, ends = [math.inf] * world, [-math.inf] * world
    gate = threading.Barrier(world)

    def rank_main(rank: int) -> None:
        gate.wait()
        starts[rank] = time.perf_counter()
        try:
            results[rank] = Result(returned=work(stores[rank], rank))
        except Exception as error:  # judged: the disagreement is raised on purpose
            results[rank] = Result(raised=error)
        ends[rank] = time.perf_counter()

    threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True) for rank in range(world)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    seconds = max(ends) - min(starts) if not any(t.is_alive() for t in threads) else math.nan
    return seconds, results, [store.total for store in stores], max(store.keys for store in stores)


def connect(port: int, world: int) -> list[Any]:
    """`world` client connections to the server on `port`, one per rank, opened 64 at a time (not timed): here one
    TCPStore connect in about 25 takes 5 s, in sequence 3.5 minutes for 1,024."""
    import torch.distributed  # noqa: PLC0415  # optional: the `live` extra

    timeout = timedelta(seconds=JOIN_TIMEOUT_S)
    with ThreadPoolExecutor(64) as pool:
        return list(
            pool.map(
                lambda _: torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout), range(world)
            )
        )


def measure_world(
    port: int, forms: Forms, policy: Any, world: int, rounds: int, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every form and kind at `world` ranks, `rounds` times, the forms' order alternating by round: one cell each."""
    clients = connect(port, world)
    exchanges = {"before": before(forms), "after": after(forms)}
    cells = {(form, kind): _empty_cell(world, form, kind) for form in FORMS for kind in KINDS}
    for round_ in range(rounds):
        for form in FORMS if round_ % 2 == 0 else FORMS[::-1]:
            for kind in KINDS:
                work = work_for(exchanges[form], forms, policy, kind, world)
                prefix = f"store-scaling/{world}/{round_}/{form}/{KINDS.index(kind)}"
                seconds, results, requests, keys = run_ranks(clients, prefix, work)
                cell = cells[form, kind]
                cell["seconds"].append(seconds)
                cell["requests_per_rank"] = _spread(cell["requests_per_rank"], requests)
                cell["keys_per_rank_max"] = max(cell["keys_per_rank_max"], keys)
                cell["problems"] += [f"round {round_}: {p}" for p in judge(kind, world, results, forms.error)]
                say(f"W={world} round {round_ + 1}/{rounds} {form:6} {kind}: {seconds:.4f} s")
    for cell in cells.values():
        cell["median_s"] = statistics.median(cell["seconds"])
    return list(cells.values())


def _empty_cell(world: int, form: str, kind: str) -> dict[str, Any]:
    return {
        "world": world,
        "form": form,
        "kind": kind,
        "seconds": [],
        "requests_per_rank": {"min": None, "max": None},
        "keys_per_rank_max": 0,
        "problems": [],
    }


def _spread(seen: dict[str, int | None], requests: list[int]) -> dict[str, int | None]:
    low, high = min(requests), max(requests)
    return {
        "min": low if seen["min"] is None else min(seen["min"], low),
        "max": high if seen["max"] is None else max(seen["max"], high),
    }


def series_matches(forms: Forms, patches_texts: Sequence[str]) -> bool:
    """Whether the tree's exchange functions are, line for line, what the series' last patch adding each writes."""
    modules = {sys.modules[forms.exchange_load_outcome.__module__], sys.modules[forms.agree_through_store.__module__]}
    for name in (*LOAD_OUTCOME_FUNCTIONS, *AGREEMENT_FUNCTIONS):
        function = next(getattr(m, name) for m in modules if hasattr(m, name))
        added = [source for text in patches_texts if (source := added_function(text, name)) is not None]
        if not added or added[-1] != inspect.getsource(function):
            return False
    return True


def one_client_get_us(port: int, requests: int = 20_000, bursts: int = 5) -> float:
    """Microseconds per `get` of one client alone, back to back (median of `bursts`): the store's round trip on this
    loopback without any other client, for reading the before form's W^2 gets against."""
    client = connect(port, 1)[0]
    client.set("store-scaling/one-client", "x" * 228)
    timings = []
    for _ in range(bursts):
        started = time.perf_counter()
        for _ in range(requests):
            client.get("store-scaling/one-client")
        timings.append((time.perf_counter() - started) / requests * 1e6)
    return statistics.median(timings)


def host() -> dict[str, Any]:
    import torch  # noqa: PLC0415  # optional: the `live` extra

    return {
        "machine": platform.machine(),
        "system": platform.platform(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_at_start": list(os.getloadavg()),
    }


def start_server() -> Any:
    """One TCPStore server on the loopback, libuv backend, as torchrun's agent store; not waiting for workers."""
    import torch.distributed  # noqa: PLC0415  # optional: the `live` extra

    return torch.distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )


def judge_record(record: dict[str, Any]) -> list[str]:
    """What is wrong with a run's record: a cell missing for a W, form and kind, a round missing, a time that is not
    a finite positive number, a median that is not the rounds' median, a request count missing, a judged problem."""
    problems: list[str] = []
    try:
        worlds = list(record["worlds"])
        rounds = {int(world): int(count) for world, count in record["rounds"].items()}
        cells = {(c["world"], c["form"], c["kind"]): c for c in record["cells"]}
        wanted = [(w, f, k) for w in worlds for f in FORMS for k in KINDS]
        problems += [f"no cell for W={w} {f} {k}" for w, f, k in wanted if (w, f, k) not in cells]
        for (world, form, kind), cell in cells.items():
            problems += [f"W={world} {form} {kind}: {p}" for p in _cell_problems(cell, rounds[world])]
    except (KeyError, TypeError, ValueError) as error:
        problems.append(f"record malformed: {type(error).__name__}: {error}")
    return problems


def _cell_problems(cell: dict[str, Any], rounds: int) -> list[str]:
    seconds, problems = cell["seconds"], list(cell["problems"])
    if len(seconds) != rounds:
        problems.append(f"{len(seconds)} rounds, not {rounds}")
    if not all(isinstance(s, float | int) and math.isfinite(s) and s > 0 for s in seconds):
        problems.append(f"a time that is not a finite positive number: {seconds}")
    median = cell["median_s"]
    if not (
        isinstance(median, float | int) and math.isfinite(median) and seconds and median == statistics.median(seconds)
    ):
        problems.append(f"median {median} is not the rounds' median")
    spread = cell["requests_per_rank"]
    if not all(isinstance(spread[end], int) and spread[end] > 0 for end in ("min", "max")):
        problems.append(f"requests per rank missing: {spread}")
    if not (isinstance(cell["keys_per_rank_max"], int) and cell["keys_per_rank_max"] > 0):
        problems.append("keys per rank missing")
    return problems


def render(record: dict[str, Any]) -> str:
    """The record as the Markdown table docs/scaling.md quotes, with where and how it ran."""
    cells = {(c["world"], c["form"], c["kind"]): c for c in record["cells"]}
    lines = [
        f"`{record['command']}`",
        "",
        f"Host: {record['host']['system']}, {record['host']['cpus_usable']} usable CPUs, Python "
        f"{record['host']['python']}, torch {record['host']['torch']}; tree {record['tree']} "
        f"(exchange functions identical to the series' text: {'yes' if record['tree_is_series'] else 'NO'}). "
        f"One client alone: {record['one_client_get_us']:.1f} us per get (median of 5 bursts of 20,000). "
        f"Clients: {record['clients']}. Every time is the median of the rounds named in its row, from the release "
        "of every rank to the last rank's return.",
        "",
        "| exchange | W | rounds | before s | after s | before / after | requests per rank, before | after "
        "| keys named per rank, before | after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        for world in record["worlds"]:
            old, new = cells[world, "before", kind], cells[world, "after", kind]
            lines.append(
                f"| {kind} | {world:,} | {len(old['seconds'])} | {old['median_s']:.4f} | {new['median_s']:.4f} | "
                f"{old['median_s'] / new['median_s']:.1f} | {_span(old)} | {_span(new)} | "
                f"{old['keys_per_rank_max']:,} | {new['keys_per_rank_max']:,} |"
            )
    return "\n".join(lines) + "\n"


def _span(cell: dict[str, Any]) -> str:
    low, high = cell["requests_per_rank"]["min"], cell["requests_per_rank"]["max"]
    return f"{high:,}" if low == high else f"{low:,}-{high:,}"
