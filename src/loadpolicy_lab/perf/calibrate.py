"""Calibration: the cost model's predictions for a `loadpolicy dev perf bench` run, beside what that run measured.

For every benchmarked (model, policy, ranks), the largest rank's peak RSS (total, anonymous, file-backed) and what it
holds after loading, scored as the model's own part: measured minus the pre-load baseline, against the prediction.
`HELD_OUT` cases are scored apart; `loadpolicy dev perf calibrate` exits non-zero when a scored figure misses
(`TOLERANCE`). How it is scored and the results: docs/scaling.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadpolicy.errors import CommandError, missing_extra
from loadpolicy.plan.cost import Launch, Plan, predict
from loadpolicy.plan.inventory import Inventory, inventory_from_config
from loadpolicy.units import GIB
from loadpolicy_lab.models.bench import FULL, SMOKE, BenchModel
from loadpolicy_lab.models.published import SHAPES_BY_NAME
from loadpolicy_lab.perf.cases import CASES, LOADS


TOLERANCE = 0.20  # the bound the cost model is held to: predictions within 20% of measurements
MIN_SCORED_GIB = 0.1  # own parts below this are within the RSS noise of a launch (a few tens of MiB)
# (model, case, ranks) kept out of tuning: 10 of the 28 cases of the full bench, named before the run that scores them
HELD_OUT = frozenset(
    {
        ("moe-850m", "Zero3Init (stock)", 4),
        ("moe-850m", "MetaShardOnRead: plain EP", 4),
        ("moe-850m", "EPMeta: partition reads", 4),
        ("dense-300m", "Zero3Init (stock)", 4),
        ("dense-300m", "MetaShardOnRead: dense ZeRO-3", 4),
        ("moe-300m", "EPMeta: partition reads", 2),
        ("moe-850m", "Zero3Init: partition reads", 4),
        ("dense-300m", "Zero3Init: partition reads", 2),
        # named after the run of 2026-11-26 that added dense-1b (scored there as tuning), held out from the next
        ("dense-1b", "Zero3Init: partition reads", 4),
        ("dense-1b", "MetaShardOnRead: dense ZeRO-3", 2),
    }
)


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    model: str
    case: str
    ranks: int
    figure: str
    predicted_gib: float  # the model's own part: no baseline
    measured_gib: float  # measured minus the baseline
    held_out: bool = False

    @property
    def ratio(self) -> float:
        return self.predicted_gib / self.measured_gib if self.measured_gib > 0 else float("inf")

    @property
    def scored(self) -> bool:
        return self.measured_gib >= MIN_SCORED_GIB

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= TOLERANCE  # NaN and inf fail


def launch_for_case(label: str, ranks: int) -> Launch:
    """The launch a bench case runs, from its definition in `bench/run.py` CASES.

    Its EP launches are `DistributedConfig(tp_size=W, ep_size=W)`: under EPMeta the TP plan is left to ZeRO-3.
    """
    case = next((c for c in CASES if c.label == label), None)
    if case is None:
        raise ValueError(f"unknown bench case {label!r}; known: {', '.join(c.label for c in CASES)}")
    return Launch(case.shape(ranks))


def predicted_figures(plan: Plan) -> dict[str, float]:
    """The model's own part of each figure, in bytes (the largest rank's)."""
    # The bench's peaks include the RSS once every tensor was touched, so peak file-backed memory is what the rank
    # read. Reads are not scored: the ranks share one page cache and together read the whole checkpoint under every
    # policy, a constant the model cannot get wrong.
    costs = plan.ranks
    return {
        "peak total": max(c.peak_anon.nbytes + c.peak_file.nbytes for c in costs),
        "peak anonymous": max(c.peak_anon.nbytes for c in costs),
        "peak file-backed": max(c.peak_file.nbytes for c in costs),
        "held": max(c.resident.nbytes for c in costs),
    }


def measured_figures(launches: list[dict[str, Any]]) -> dict[str, float]:
    """The same figures measured (the median over a case's launches, rows of bench.json), minus the baseline of the
    kind of memory each counts, in bytes."""
    # Adding the baseline to the prediction instead would score the process's imports as if the model predicted them
    memory = [launch["memory"] for launch in launches]

    def middle(figure: str) -> float:
        return statistics.median(float(m[figure]) for m in memory)

    anon, file = middle("baseline_anon_gib"), middle("baseline_file_gib")
    return {
        "peak total": (middle("peak_gib") - anon - file) * GIB,
        "peak anonymous": (middle("peak_anon_gib") - anon) * GIB,
        "peak file-backed": (middle("peak_file_gib") - file) * GIB,
        "held": (middle("held_gib") - anon - file) * GIB,
    }


def _bench_model(name: str) -> BenchModel:
    return next(m for m in (*FULL, *SMOKE) if m.name == name)


def calibrate(bench: Path) -> list[CalibrationRow]:
    cases: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for launch in json.loads((bench / "bench.json").read_text(encoding="utf-8")):
        cases.setdefault((launch["shape"], launch["way"], launch["ranks"]), []).append(launch)
    inventories: dict[str, Inventory] = {}
    rows = []
    for (name, case, ranks), launches in cases.items():
        if any(launch["error"] for launch in launches):
            continue
        model = _bench_model(name)
        if model.name not in inventories:
            inventories[model.name] = inventory_from_config(model.transformers_config())
        plan = predict(launch_for_case(case, ranks), inventories[model.name])
        held_out = (model.name, case, ranks) in HELD_OUT
        rows += [
            CalibrationRow(model.name, case, ranks, figure, value / GIB, got / GIB, held_out)
            for (figure, value), got in zip(
                predicted_figures(plan).items(), measured_figures(launches).values(), strict=True
            )
        ]
    return rows


def render_calibration(rows: list[CalibrationRow]) -> str:
    lines = [
        "| model | policy | ranks | set | figure | predicted GiB | measured - baseline GiB | predicted / measured |",
        "|---|---|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        flag = " (not scored: own part too small)" if not r.scored else "" if r.within else " **outside 20%**"
        lines.append(
            f"| {r.model} | {r.case} | {r.ranks} | {'held out' if r.held_out else 'tuning'} | {r.figure} "
            f"| {r.predicted_gib:.2f} | {r.measured_gib:.2f} | {r.ratio:.2f}{flag} |"
        )
    lines.append("")
    for name, held_out in (("tuning", False), ("held out", True)):
        scored = [r for r in rows if r.scored and r.held_out is held_out]
        lines.append(f"{name}: {sum(r.within for r in scored)}/{len(scored)} scored figures within {TOLERANCE:.0%}.")
    return "\n".join(lines)


def misses(rows: list[CalibrationRow]) -> list[CalibrationRow]:
    """Scored figures outside the tolerance: `loadpolicy dev perf calibrate` fails on any."""
    return [r for r in rows if r.scored and not r.within]


def _run_calibrate(args: argparse.Namespace) -> str:
    if not (args.bench / "bench.json").is_file():
        raise CommandError(
            f"--bench {str(args.bench)!r} holds no bench.json; accepted: the output directory of a "
            "`loadpolicy dev perf bench` run (its default writes build/bench, `tox -e bench-smoke` build/bench-smoke)"
        )
    try:
        rows = calibrate(args.bench)
    except ModuleNotFoundError as exc:
        raise missing_extra("loadpolicy dev perf calibrate", exc.name or "transformers") from None
    text = render_calibration(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration.md").write_text(text + "\n", encoding="utf-8")
    (args.out / "calibration.json").write_text(json.dumps([asdict(r) for r in rows], indent=2), encoding="utf-8")
    if missed := misses(rows):
        names = ", ".join(f"{r.model} {r.case} x{r.ranks} {r.figure} ({r.ratio:.2f})" for r in missed)
        raise CalibrationMissError(f"{text}\n\n{len(missed)} scored figures outside {TOLERANCE:.0%}: {names}")
    return text


class CalibrationMissError(CommandError):
    """The cost model missed a measured figure by more than the tolerance."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("calibrate", help="the cost model's predictions beside a bench run's measurements")
    parser.add_argument("--bench", type=Path, default=Path("build/bench"), help="the bench's output directory")
    parser.add_argument("--out", type=Path, default=Path("build/plan"))
    parser.set_defaults(handler=_run_calibrate)


def calibrate_widths(rows: list[dict[str, Any]]) -> list[CalibrationRow]:
    """A row per load of `rows` (widths.json) that passed its judge."""
    cases = {case.label: case for case in LOADS}
    inventories: dict[str, Any] = {}
    found = []
    for row in rows:
        case = cases.get(row["way"])
        if case is None or row["error"] or row["peak_gib"] is None:
            continue
        shape = SHAPES_BY_NAME[row["shape"]]
        if shape.name not in inventories:
            inventories[shape.name] = inventory_from_config(shape.architecture.transformers_config())
        plan = predict(Launch(case.shape(row["ranks"])), inventories[shape.name])
        baseline = row["ideal_gib"] - row["checkpoint_gib"] / row["ranks"]
        predicted = predicted_figures(plan)["peak total"] / GIB
        found.append(
            CalibrationRow(
                shape.name, case.label, row["ranks"], "peak total", predicted, row["peak_gib"] - baseline, True
            )
        )
    return found
