"""`loadpolicy dev validate --architectures all`: every EP-capable model type of the pinned release, generated tiny.

The stock tree generates the checkpoints (`models/generate.py`) and loads each in one process (the reference);
then every generated type runs through the matrix's EP scenarios at 2 and 4 ranks, judged as the matrix judges:
same policy on every rank, nothing on meta, nothing missing or unexpected, expert shards equal to the checkpoint's
slice, logits (or the last hidden state) equal to the one-process load. Writes `architectures.md` and `.json`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from loadpolicy_lab.harness.launch import Launcher, Tree, run_bounded, tree_env
from loadpolicy_lab.harness.trees import Workspace
from loadpolicy_lab.matrix.cases import Run, Scenario
from loadpolicy_lab.matrix.run import RunOutcome, run_scenario
from loadpolicy_lab.models.checkpoints import build_references


# (scenario, tree): plain EP on stock is the baseline (what loads without ZeRO-3 today); EP under ZeRO-3 on stock
# must fail with the bug; the patched tree must load it in both EP shapes.
COLUMNS = (
    (Scenario.PLAIN_EP, Tree.STOCK),
    (Scenario.EP_ZERO3, Tree.STOCK),
    (Scenario.EP_ZERO3, Tree.PATCHED),
    (Scenario.EP_ZERO3_DISPATCH, Tree.PATCHED),
)
RANKS = (2, 4)


def generate_checkpoints(stock: Path, out: Path, timeout: float, only: list[str]) -> dict[str, Any]:
    """Run the generator in the stock tree; its manifest says, per model type, what was built or why not."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-W", "ignore", "-m", "loadpolicy_lab.models.generate", str(out), *only]
    env = tree_env(stock) | {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    code = run_bounded(command, env, out / "generate.log", timeout)
    manifest_path = out / "manifest.json"
    if code != 0 or not manifest_path.exists():
        log = (out / "generate.log").read_text(encoding="utf-8")[-2000:]
        raise RuntimeError(f"generating the tiny checkpoints exited {code}:\n{log}")
    manifest: dict[str, Any] = json.loads(manifest_path.read_text(encoding="utf-8"))
    return manifest


def run_architectures(where: Workspace, *, only: list[str], ranks: tuple[int, ...] = RANKS) -> int:
    started = time.monotonic()
    out, timeout = where.out, where.timeout
    trees = where.ready_trees()
    checkpoints = out.resolve() / "checkpoints"
    manifest = generate_checkpoints(trees[Tree.STOCK], checkpoints, timeout * 4, only)
    built = {name: entry["model_class"] for name, entry in manifest.items() if entry.get("built")}
    print(f"generated {len(built)} of {len(manifest)} EP-capable model types ({time.monotonic() - started:.0f}s)")
    build_references({(name, False) for name in built}, checkpoints, trees[Tree.STOCK], timeout * 4, built)
    archs = tuple(sorted(built))
    runs = [Run(s, tree, Launcher.TORCHRUN, n, archs=archs) for s, tree in COLUMNS for n in ranks]
    outcomes: list[RunOutcome] = []
    for index, run in enumerate(runs, start=1):
        # one launch loads every architecture; its bound grows with their number (a tiny load takes 1-3 s)
        outcome = run_scenario(
            run, trees, checkpoints, out / "runs" / f"{index:03d}", timeout + 20.0 * len(archs), built
        )
        outcomes.append(outcome)
        passed = sum(outcome.as_expected(a) for a in outcome.archs)
        print(
            f"[{index}/{len(runs)}] {run.label}: {passed}/{len(archs)} as expected ({outcome.seconds:.0f}s)"
            + (f" {outcome.launch_error}" if outcome.launch_error else ""),
            flush=True,
        )
    rows = table_rows(manifest, outcomes)
    (out / "architectures.json").write_text(json.dumps(rows, indent=2), encoding="utf-8")
    (out / "architectures.md").write_text(render(rows, outcomes), encoding="utf-8")
    goal = [r for r in rows if r["plain_ep_stock"] and not r["patched_all"]]
    print(
        f"{sum(r['patched_all'] for r in rows)} of {len(rows)} model types load under ZeRO-3 on the patched tree "
        f"in every column; {len(goal)} that plain EP loads on stock do not; {time.monotonic() - started:.0f}s"
    )
    print(f"report: {out / 'architectures.md'}", file=sys.stderr)
    return 1 if goal else 0


def _column(outcome: RunOutcome) -> str:
    return f"{outcome.run.scenario} | {outcome.run.tree} x{outcome.run.ranks}"


def _cell(outcome: RunOutcome, arch: str) -> tuple[bool, str]:
    for result in outcome.archs:
        if result.arch == arch:
            return outcome.as_expected(result), result.detail
    return False, outcome.launch_error or "not run"


def table_rows(manifest: dict[str, Any], outcomes: list[RunOutcome]) -> list[dict[str, Any]]:
    rows = []
    for name, entry in sorted(manifest.items()):
        row: dict[str, Any] = {
            "model_type": name,
            "model_class": entry.get("model_class"),
            "built": entry.get("built"),
        }
        if not entry.get("built"):
            row["cause"] = f"not generated: {entry.get('error', '')} ({entry.get('where', '')})"
            row |= {"plain_ep_stock": False, "patched_all": False, "cells": {}}
            rows.append(row)
            continue
        cells = {}
        for outcome in outcomes:
            ok, detail = _cell(outcome, name)
            cells[_column(outcome)] = {"ok": ok, "detail": detail}
        plain = [c for k, c in cells.items() if k.startswith(f"{Scenario.PLAIN_EP} | {Tree.STOCK}")]
        patched = [c for k, c in cells.items() if f"| {Tree.PATCHED} x" in k]
        row |= {
            "plain_ep_stock": bool(plain) and all(c["ok"] for c in plain),
            "patched_all": bool(patched) and all(c["ok"] for c in patched),
            "cells": cells,
        }
        # the patched tree's failures first: they are what the goal counts
        ordered = sorted(cells.items(), key=lambda item: f"| {Tree.PATCHED} x" not in item[0])
        failed = [f"{k}: {c['detail']}" for k, c in ordered if not c["ok"]]
        row["cause"] = failed[0][:300] if failed else ""
        rows.append(row)
    return rows


_SHORT = {
    f"{Scenario.PLAIN_EP} | {Tree.STOCK}": "plain EP, stock",
    f"{Scenario.EP_ZERO3} | {Tree.STOCK}": "EP + ZeRO-3, stock",
    f"{Scenario.EP_ZERO3} | {Tree.PATCHED}": "EP + ZeRO-3 (tp = ep), patched",
    f"{Scenario.EP_ZERO3_DISPATCH} | {Tree.PATCHED}": "EP + ZeRO-3 (token dispatch), patched",
}


def _header(key: str) -> str:
    column, _, ranks = key.rpartition(" x")
    return f"{_SHORT.get(column, column)} x{ranks}"


def render(rows: list[dict[str, Any]], outcomes: list[RunOutcome]) -> str:
    """The table: one row per model type; `bug` where stock fails with the ZeRO-3 device_map refusal, as it must."""
    keys = [_column(o) for o in outcomes]
    stock_bug = {k for k, o in zip(keys, outcomes, strict=True) if o.run.tree is Tree.STOCK and o.run.spec.stock_fails}
    built = [r for r in rows if r["built"]]
    plain, patched = sum(r["plain_ep_stock"] for r in built), sum(r["patched_all"] for r in built)
    short = sum(r["plain_ep_stock"] and not r["patched_all"] for r in built)
    lines = [
        f"{len(rows)} EP-capable model types; {len(built)} generated; plain EP loads {plain} on stock; the patched "
        f"tree loads {patched} under ZeRO-3 in every column; {short} that plain EP loads on stock do not.",
        "",
        "| model type | class | " + " | ".join(map(_header, keys)) + " | first failure |",
        "|" + "---|" * (len(keys) + 3),
    ]
    for row in rows:
        marks = []
        for key in keys:
            ok = row["cells"].get(key, {}).get("ok")
            marks.append("-" if not row["built"] else ("bug" if key in stock_bug else "ok") if ok else "FAIL")
        cause = str(row["cause"]).replace("|", "/").replace("\n", " ")
        lines.append(f"| {row['model_type']} | {row['model_class']} | " + " | ".join(marks) + f" | {cause} |")
    return "\n".join(lines) + "\n"
