"""Calibration: the cost model's predictions for a `loadpolicy bench` run, beside what that run measured.

For every benchmarked (model, policy, ranks) it predicts the bench's own figures: the largest per-rank peak RSS (total,
anonymous, file-backed), what the largest rank holds after loading, and the storage reads of all ranks together (the
ranks share one page cache, so together they read each checkpoint byte that any of them needs once). The baseline is
not predicted: it is the bench's measured RSS just before `from_pretrained` (split into anonymous and file-backed),
added to each figure. Peaks are the bench's: the larger of the peak during loading and the RSS once every loaded tensor
has been touched, so the predicted peak file-backed memory is what the rank read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadpolicy.bench.models import FULL, SMOKE, BenchModel
from loadpolicy.bench.run import CASES
from loadpolicy.plan.cost import Launch, Plan, predict
from loadpolicy.plan.inventory import Inventory, inventory_from_config
from loadpolicy.policy import PolicyName, parse_policy_name


GIB = 1024**3
TOLERANCE = 0.20  # the bound: predictions within 20% of measurements


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    model: str
    case: str
    ranks: int
    figure: str
    predicted_gib: float
    measured_gib: float

    @property
    def ratio(self) -> float:
        return self.predicted_gib / self.measured_gib if self.measured_gib else float("inf")

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE


def launch_for_case(label: str, ranks: int) -> Launch:
    """The launch a bench case runs, from its definition in `bench/run.py` CASES.

    Its EP launches are `DistributedConfig(tp_size=W, ep_size=W)`: under EPMeta the TP plan is left to ZeRO-3.
    """
    case = next((c for c in CASES if c.label == label), None)
    if case is None:
        raise ValueError(f"unknown bench case {label!r}; known: {', '.join(c.label for c in CASES)}")
    policy = parse_policy_name(case.policy)
    ep = ranks if case.ep else 1
    tp = ep if policy is PolicyName.META_SHARD_ON_READ else 1
    return Launch(ranks, policy, ep=ep, tp=tp, zero3=case.zero3 and policy is PolicyName.META_SHARD_ON_READ)


def predicted_figures(plan: Plan, base_anon: float, base_file: float) -> dict[str, float]:
    costs = plan.ranks
    return {
        "peak total": base_anon + base_file + max(c.peak_anon.nbytes + c.peak_file.nbytes for c in costs),
        "peak anonymous": base_anon + max(c.peak_anon.nbytes for c in costs),
        "peak file-backed": base_file + max(c.peak_file.nbytes for c in costs),
        "held": base_anon + base_file + max(c.resident.nbytes for c in costs),
        "reads, all ranks": float(plan.inventory.total_bytes),
    }


def measured_figures(row: dict[str, Any]) -> dict[str, float]:
    return {
        "peak total": row["peak_gib"]["median"] * GIB,
        "peak anonymous": row["peak_anon_gib"]["median"] * GIB,
        "peak file-backed": row["peak_file_gib"]["median"] * GIB,
        "held": row["held_gib"]["median"] * GIB,
        "reads, all ranks": row["read_gib"]["median"] * GIB,
    }


def _bench_model(name: str) -> BenchModel:
    return next(m for m in (*FULL, *SMOKE) if m.name == name)


def calibrate(bench: Path) -> list[CalibrationRow]:
    measured_rows = [r for r in json.loads((bench / "bench.json").read_text(encoding="utf-8")) if not r["error"]]
    inventories: dict[str, Inventory] = {}
    rows = []
    for measured in measured_rows:
        model = _bench_model(measured["model"])
        if model.name not in inventories:
            inventories[model.name] = inventory_from_config(model.transformers_config())
        plan = predict(launch_for_case(measured["case"], measured["ranks"]), inventories[model.name])
        base = (measured["baseline_anon_gib"] * GIB, measured["baseline_file_gib"] * GIB)
        predicted = predicted_figures(plan, *base)
        rows += [
            CalibrationRow(model.name, measured["case"], measured["ranks"], figure, value / GIB, got / GIB)
            for (figure, value), got in zip(predicted.items(), measured_figures(measured).values(), strict=True)
        ]
    return rows


def render_calibration(rows: list[CalibrationRow]) -> str:
    lines = [
        "| model | policy | ranks | figure | predicted GiB | measured GiB | predicted / measured |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        flag = "" if r.within else " **outside 20%**"
        lines.append(
            f"| {r.model} | {r.case} | {r.ranks} | {r.figure} | {r.predicted_gib:.2f} | {r.measured_gib:.2f} "
            f"| {r.ratio:.2f}{flag} |"
        )
    outside = sum(not r.within for r in rows)
    lines.append("")
    lines.append(f"{len(rows) - outside}/{len(rows)} figures within {TOLERANCE:.0%} of the measurement.")
    return "\n".join(lines)
