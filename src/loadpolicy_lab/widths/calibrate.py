"""The cost model against a real-widths run: its predicted peak for every load, beside the measured one.

Every row is held out (the model was never tuned on these shapes). Scored as `bench.calibrate` scores the bench: the
largest rank's peak minus its pre-load baseline, within `TOLERANCE`; reported, not enforced (docs/scaling.md).
"""

from __future__ import annotations

from typing import Any

from loadpolicy.plan.cost import Launch, predict
from loadpolicy.plan.inventory import inventory_from_config
from loadpolicy.units import GIB
from loadpolicy_lab.bench.calibrate import CalibrationRow, predicted_figures
from loadpolicy_lab.models.published import SHAPES_BY_NAME
from loadpolicy_lab.widths.cases import LOADS


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
