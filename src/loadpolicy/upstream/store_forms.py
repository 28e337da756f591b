"""The two store exchanges of a collective `from_pretrained` (issue 62), in the form that ships and the one before it.

Every collective `from_pretrained` of the series makes two exchanges through the process group's store: the
load-policy agreement (patch 0036, reworked by 0038) and the load outcome report (patch 0037). Before issue 62 every
rank read every other rank's key in both (W gets per rank, W^2 requests on one store); the series now makes a fixed
number of requests per rank. This module holds:

- the shipped forms, taken from a patched tree (`tree_forms`: `exchange_load_outcome` and `agree_through_store`
  imported from its `src/`) or from the series' own text (`series_forms`: the functions as the last patch that adds
  them writes them, run here without a tree or torch, for the unit tests);
- the forms before issue 62 (`before_load_outcome`, `before_agree`), written here as the reference they are compared
  against: the same store requests, in the same order, as `_report_load_outcome` and `agree_on_load_inputs` of the
  series at 8cdf46d (patches 0037 and 0038), over the same store arguments as the shipped functions;
- `CountingStore`, which counts each rank's requests and the keys they name.
"""

from __future__ import annotations

import builtins
import dis
import hashlib
import importlib
import json
import re
import sys
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from loadpolicy.policy import LoadPolicyError, check_ranks_agree
from loadpolicy.upstream.series import read_series


Failed = dict[int, str]
LoadOutcome = Callable[[Any, str, int, int, "str | None", timedelta], tuple[Failed, list[int]]]
Agree = Callable[[Any, int, int, int, dict[str, object]], None]


class Store(Protocol):
    """The requests the exchanges make: `torch.distributed.Store`'s (TCPStore, PrefixStore)."""

    def set(self, key: str, value: str | bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def append(self, key: str, value: str | bytes) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def wait(self, keys: list[str], timeout: timedelta) -> None: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...


@dataclass(frozen=True)
class Forms:
    """The shipped exchanges and what the reference forms share with them (the check, the error, the timeouts)."""

    exchange_load_outcome: LoadOutcome
    agree_through_store: Agree
    check_ranks_agree: Callable[[list[dict[str, object]]], None]
    error: type[Exception]
    timeouts: dict[str, timedelta]  # LOAD_POLICY_AGREEMENT_TIMEOUT, LOAD_OUTCOME_TIMEOUT, ... by name
    where: str  # the tree's path, or the series directory


@dataclass(frozen=True)
class Exchange:
    """One form of both exchanges, as functions of a store (one per rank) and the rank's part."""

    label: str  # "before" or "after"
    load_outcome: LoadOutcome
    agree: Agree


def after(forms: Forms) -> Exchange:
    return Exchange("after", forms.exchange_load_outcome, forms.agree_through_store)


def before(forms: Forms) -> Exchange:
    def agree(store: Store, index: int, rank: int, world_size: int, entry: dict[str, object]) -> None:
        before_agree(forms, store, index, rank, world_size, entry)

    return Exchange("before", before_load_outcome, agree)


# --- the reference: the forms before issue 62 (patches 0037 and 0038 at 8cdf46d), not the code that ships ------------


def before_load_outcome(
    store: Store, prefix: str, rank: int, world_size: int, error: str | None, timeout: timedelta
) -> tuple[Failed, list[int]]:
    """REFERENCE, before issue 62: `_report_load_outcome`'s requests. Every rank sets its key, waits for all W keys,
    then gets each of them (W gets per rank). Where it raised naming the missing ranks, this returns them."""
    keys = [f"{prefix}{other}" for other in range(world_size)]
    store.set(keys[rank], json.dumps(error))
    try:
        store.wait(keys, timeout)
    except RuntimeError:  # torch.distributed.DistStoreError is a RuntimeError
        if error is not None:
            return {}, []  # this rank raises its own error anyway
        return {}, [other for other, key in enumerate(keys) if not store.check([key])]
    outcomes = {other: json.loads(store.get(key)) for other, key in enumerate(keys)}
    return {other: outcome for other, outcome in outcomes.items() if outcome is not None}, []


def before_agree(forms: Forms, store: Store, index: int, rank: int, world_size: int, entry: dict[str, object]) -> None:
    """REFERENCE, before issue 62: `agree_on_load_inputs`'s requests. Every rank sets its key, polls `check` of all W
    keys with a sleep of 1 ms doubling to 0.1 s, looks at single ranks only after the disagreement timeout, then gets
    each of the W keys."""
    prefix = f"transformers/load_policy/{index}/"
    store.set(f"{prefix}{rank}", json.dumps(entry))
    keys = [f"{prefix}{other}" for other in range(world_size)]
    started, poll = time.monotonic(), 0.001
    while not store.check(keys):
        waited = timedelta(seconds=time.monotonic() - started)
        if waited > forms.timeouts["LOAD_POLICY_DISAGREEMENT_TIMEOUT"]:
            _before_slow_path(forms, store, index, keys, waited)
        time.sleep(poll)
        poll = min(2 * poll, 0.1)
    forms.check_ranks_agree([json.loads(store.get(key))["inputs"] for key in keys])


def _before_slow_path(forms: Forms, store: Store, index: int, keys: list[str], waited: timedelta) -> None:
    """REFERENCE: the before form's look at the missing ranks once the disagreement timeout has passed."""
    missing = [other for other, key in enumerate(keys) if not store.check([key])]
    local = {other: _local_load_at(store, other, index) for other in missing}
    if all(local.values()):
        entries = {other: json.loads(store.get(keys[other])) for other in range(len(keys)) if other not in local}
        forms.check_ranks_agree([(local.get(other) or entries[other])["inputs"] for other in range(len(keys))])
    limit = forms.timeouts["LOAD_POLICY_AGREEMENT_TIMEOUT"]
    if waited > limit:
        raise forms.error(
            f"Ranks {missing} did not reach the load-policy agreement of `from_pretrained` within "
            f"{limit.total_seconds():.0f}s: every rank must call `from_pretrained` "
            "with the same DeepSpeed and distributed configuration."
        )


def _local_load_at(store: Store, rank: int, index: int) -> Any:
    """REFERENCE: the series' `_local_load_at`, unchanged by issue 62."""
    key = f"transformers/load_policy/local/{rank}"
    if not store.check([key]):
        return None
    entry = json.loads(store.get(key))
    return entry if entry["index"] == index else None


# --- counting --------------------------------------------------------------------------------------------------------


class CountingStore:
    """Forwards each request to `store` and counts it: `requests[method]`, and `keys`, the keys the requests name (a
    `wait` or `check` of W keys is one request naming W keys)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.requests: Counter[str] = Counter()
        self.keys = 0

    def _count(self, method: str, keys: int = 1) -> None:
        self.requests[method] += 1
        self.keys += keys

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def set(self, key: str, value: str | bytes) -> None:
        self._count("set")
        self._store.set(key, value)

    def get(self, key: str) -> bytes:
        self._count("get")
        return self._store.get(key)

    def add(self, key: str, amount: int) -> int:
        self._count("add")
        return self._store.add(key, amount)

    def append(self, key: str, value: str | bytes) -> None:
        self._count("append")
        self._store.append(key, value)

    def check(self, keys: list[str]) -> bool:
        self._count("check", len(keys))
        return self._store.check(keys)

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        self._count("wait", len(keys))
        self._store.wait(keys, timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._count("multi_get", len(keys))
        return self._store.multi_get(keys)


# --- where the shipped forms come from -------------------------------------------------------------------------------

_TIMEOUT = re.compile(
    r'^[+ ](?P<name>LOAD_\w+_TIMEOUT) = timedelta\(seconds=(?:int\(os\.environ\.get\("\w+", "(?P<env>\d+)"\)\)|'
    r"(?P<plain>\d+))\)$",
    re.MULTILINE,
)
LOAD_OUTCOME_FUNCTIONS = ("exchange_load_outcome",)
AGREEMENT_FUNCTIONS = ("agree_through_store", "_wait_for_every_rank_to_agree", "_get_all", "_local_load_at")


def tree_forms(tree: Path | None) -> Forms:
    """The shipped forms imported from `tree/src` (None: the `transformers` this interpreter imports)."""
    if tree is not None:
        src = str((tree / "src").resolve())
        loaded = sys.modules.get("transformers")
        if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(src):
            raise ImportError(f"transformers is already imported from {loaded.__file__}, not from {src}")
        sys.path.insert(0, src)
    modeling = importlib.import_module("transformers.modeling_utils")
    deepspeed = importlib.import_module("transformers.integrations.deepspeed")
    policy = importlib.import_module("transformers.integrations.load_policy")
    missing = [
        name
        for module, name in ((modeling, "exchange_load_outcome"), (deepspeed, "agree_through_store"))
        if not hasattr(module, name)
    ]
    if missing:
        raise ImportError(f"{modeling.__file__}'s tree has no {missing}: not a tree of the series after issue 62")
    names = ("LOAD_POLICY_AGREEMENT_TIMEOUT", "LOAD_POLICY_DISAGREEMENT_TIMEOUT")
    timeouts = {name: getattr(deepspeed, name) for name in names}
    timeouts |= {name: getattr(modeling, name) for name in ("LOAD_OUTCOME_TIMEOUT", "LOAD_FAILURE_NOTICE_TIMEOUT")}
    return Forms(
        modeling.exchange_load_outcome,
        deepspeed.agree_through_store,
        policy.check_ranks_agree,
        policy.LoadPolicyError,
        timeouts,
        str(Path(str(modeling.__file__)).parents[2]),
    )


class DistStoreError(RuntimeError):
    """Stands in for `torch.distributed.DistStoreError` (a RuntimeError) where the series' functions run without
    torch."""


def added_function(text: str, name: str) -> str | None:
    """The source of top-level function `name` as a patch adds it (its `+` lines), or None where it adds none."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(f"+def {name}(")]
    if not starts:
        return None
    body = [lines[starts[-1]][1:]]
    for line in lines[starts[-1] + 1 :]:
        if not line.startswith("+") or (len(line) > 1 and not line[1].isspace() and line[1] != ")"):
            break
        body.append(line[1:])
    return "\n".join(body).rstrip() + "\n"


def _last_added(texts: list[str], name: str) -> str:
    found = [source for text in texts if (source := added_function(text, name)) is not None]
    if not found:
        raise LookupError(f"no patch of the series adds `def {name}(`")
    return found[-1]


def _globals_read(code: types.CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_read(const)
    return names


def series_forms(patches: Path) -> Forms:
    """The shipped forms from the series' text: each function as the last patch that adds it writes it, run with the
    loadpolicy policy module the series' `load_policy.py` is generated from (patch 0035), json, hashlib, and the
    timeouts the patches set. Raises where a function reads a name this does not provide."""
    series = read_series(patches)
    texts = [(patches / name).read_text(encoding="utf-8") for name in series.names]
    namespace: dict[str, Any] = {
        "json": json,
        "hashlib": hashlib,
        "timedelta": timedelta,
        "torch": types.SimpleNamespace(distributed=types.SimpleNamespace(DistStoreError=DistStoreError)),
        "check_ranks_agree": check_ranks_agree,
        "LoadPolicyError": LoadPolicyError,
    }
    timeouts = {
        match["name"]: timedelta(seconds=int(match["env"] or match["plain"]))
        for text in texts
        for match in _TIMEOUT.finditer(text)
    }
    namespace |= timeouts
    for name in (*LOAD_OUTCOME_FUNCTIONS, *AGREEMENT_FUNCTIONS):
        code = compile(_last_added(texts, name), f"{patches}:{name}", "exec")
        exec(code, namespace)  # the series' own text: what this module is here to run
    unresolved = sorted(
        {
            n
            for name in (*LOAD_OUTCOME_FUNCTIONS, *AGREEMENT_FUNCTIONS)
            for n in _globals_read(namespace[name].__code__)
        }
        - set(namespace)
        - set(dir(builtins))
    )
    if unresolved:
        raise LookupError(f"the series' exchange functions read names this module does not provide: {unresolved}")
    return Forms(
        namespace["exchange_load_outcome"],
        namespace["agree_through_store"],
        check_ranks_agree,
        LoadPolicyError,
        timeouts,
        str(patches),
    )
