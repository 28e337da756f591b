"""The table printed at the end, the JSON with every figure, and the markdown report."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadpolicy_lab.faults.run import MAX_SECONDS_TO_ERROR, FaultOutcome
from loadpolicy_lab.matrix.run import RunOutcome
from loadpolicy_lab.parity.run import ParityOutcome
from loadpolicy_lab.training.compare import MAX_RELATIVE_DIFF


def _key(outcome: RunOutcome) -> tuple[str, str, int]:
    return (str(outcome.run.scenario), str(outcome.run.launcher), outcome.run.ranks)


def rows(outcomes: list[RunOutcome]) -> list[dict[str, Any]]:
    """One row per scenario x architecture x launcher x ranks, with the stock and the patched result side by side."""
    table: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    for outcome in outcomes:
        scenario, launcher, ranks = _key(outcome)
        for arch in outcome.archs:
            row = table.setdefault(
                (scenario, arch.arch, launcher, ranks),
                {"scenario": scenario, "arch": arch.arch, "launcher": launcher, "ranks": ranks},
            )
            verdict = "pass" if arch.passed else "FAIL"
            if outcome.launch_error:
                verdict = "FAIL"
            expected = outcome.met_expectation
            tree = str(outcome.run.tree)
            row[tree] = verdict + ("" if expected else " (unexpected)")
            row[f"{tree}_detail"] = outcome.launch_error or arch.detail
            row[f"{tree}_seconds"] = round(outcome.seconds, 1)
    return list(table.values())


# a stock cell of a run the main job leaves to the sweep (stock at 4 ranks)
NOT_RUN = "not in the main job (`tox -e multigpu -- --sweep --out build/validate-sweep` runs every run)"


def render_table(outcomes: list[RunOutcome]) -> str:
    header = f"{'scenario':<28} {'arch':<12} {'launcher':<10} {'ranks':>5}  {'stock':<18} {'patched':<18} time"
    lines = [header, "-" * len(header)]
    for row in rows(outcomes):
        seconds = row.get("patched_seconds", row.get("stock_seconds", 0.0))
        lines.append(
            f"{row['scenario']:<28} {row['arch']:<12} {row['launcher']:<10} {row['ranks']:>5}  "
            f"{row.get('stock', '-'):<18} {row.get('patched', '-'):<18} {seconds:.1f}s"
        )
    return "\n".join(lines)


def _parity_row(p: ParityOutcome) -> tuple[str, ...]:
    c = p.case
    extra = ", frozen + save/reload" if c.checkpoint else ""
    extra += f", dp {c.dp} x ep {c.ranks // c.dp}" if c.dp > 1 else ""
    extra += ", token dispatch" if c.dispatch else ""
    return (
        str(c.tree),
        c.arch,
        f"{c.trainer} ({c.trainer.launcher})",
        str(c.ranks),
        f"{c.steps} {c.optimizer}, clip {c.clip}{extra}",
        "as expected" if p.passed else "NOT AS EXPECTED",
        p.detail,
    )


def render_parity(parities: Sequence[ParityOutcome]) -> str:
    header = f"{'tree':<8} {'arch':<10} {'trained with':<25} {'ranks':>5} {'steps':<32} {'result':<16} detail"
    lines = [header, "-" * len(header)]
    for p in parities:
        tree, arch, way, ranks, steps, result, detail = _parity_row(p)
        lines.append(f"{tree:<8} {arch:<10} {way:<25} {ranks:>5} {steps:<32} {result:<16} {detail} ({p.seconds:.1f}s)")
    return "\n".join(lines)


def render_faults(faults: Sequence[FaultOutcome]) -> str:
    lines = ["bad inputs (patched, torchrun)"]
    for f in faults:
        seconds = "-" if f.max_seconds is None else f"{f.max_seconds:.1f}s"
        lines.append(f"{'ok' if f.passed else 'FAIL'} x{f.ranks} {f.case}: slowest rank {seconds}, {f.detail}")
        lines += [f"    rank {rank}: {text}" for rank, text in enumerate(f.per_rank)]
    return "\n".join(lines)


def _fault_rows(faults: Sequence[FaultOutcome]) -> list[str]:
    rows = []
    for f in faults:
        seconds = "-" if f.max_seconds is None else f"{f.max_seconds:.1f}s"
        each = "<br>".join(f"rank {rank}: {text}" for rank, text in enumerate(f.per_rank)).replace("|", "/")
        left = "yes" if f.left_running else "nothing"
        rows.append(
            f"| {f.case} | {f.ranks} | {each} | {seconds} | {f.wall_seconds:.1f}s | {left} | "
            f"{'pass' if f.passed else 'FAIL: ' + f.detail} |"
        )
    return rows


@dataclass(frozen=True, slots=True)
class ValidationResults:
    """Everything one `loadpolicy dev validate` judged: the load matrix, training parity and the bad inputs."""

    loads: list[RunOutcome]
    parities: Sequence[ParityOutcome] = ()
    faults: Sequence[FaultOutcome] = ()

    def unexpected(self) -> list[object]:
        """Every run that did not behave as expected (a load, a parity case or a bad input)."""
        found: list[object] = [o for o in self.loads if is_unexpected(o)]
        return found + [p for p in self.parities if not p.passed] + [f for f in self.faults if not f.passed]


def render_markdown(results: ValidationResults, command: str) -> str:
    outcomes, parities, faults = results.loads, results.parities, results.faults
    lines = [
        "# Validation report",
        "",
        f"Command: `{command}`",
        "",
        "| scenario | arch | launcher | ranks | stock 5.23.0 | patched | time (patched) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows(outcomes):
        ran = f"{row.get('stock', '-')}: {row.get('stock_detail', '')}" if "stock" in row else NOT_RUN
        stock = ran.replace("|", "/").replace("\n", " ")
        patched = f"{row.get('patched', '-')}: {row.get('patched_detail', '')}".replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {row['scenario']} | {row['arch']} | {row['launcher']} | {row['ranks']} | {stock[:160]} | "
            f"{patched[:160]} | {row.get('patched_seconds', '-')}s |"
        )
    lines += [
        "",
        "## Training parity: EP under ZeRO-3 against one process",
        "",
        "torch AdamW (lr 1e-3, no weight decay) or SGD (lr 0.1: Adam hides a wrong gradient scale, SGD does not),",
        "float32, fixed batches, one per step; max relative difference of the per-step losses and",
        "the final weights (gathered; experts as each rank's shard) against a single process. Patched: must be within",
        f"{MAX_RELATIVE_DIFF:g}, with every expert shard bit-identical across the DeepSpeed wrap. Stock: must fail.",
        "",
        "| tree | arch | trained with | ranks | steps | result | detail | time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(_parity_row(p)) + f" | {p.seconds:.1f}s |" for p in parities]
    lines += [
        "",
        "## Reliability: bad inputs (patched tree, torchrun)",
        "",
        f"Each case must end with a clear error on every rank within {MAX_SECONDS_TO_ERROR:.0f}s of the start of",
        "`from_pretrained` (a warning where the input is legal but not what the user meant), with no process of the",
        "launch left running. Time to error: the slowest rank; launch: the whole torchrun, start-up included.",
        "",
        "| case | ranks | each rank's outcome | time to error | launch | left running | result |",
        "|---|---|---|---|---|---|---|",
        *_fault_rows(faults),
    ]
    failed = [o for o in outcomes if not o.met_expectation]
    lines += ["", f"{len(outcomes)} runs, {len(failed)} not as expected."]
    lines += [
        f"- {o.run.label}: {o.launch_error or '; '.join(a.detail for a in o.archs if not a.passed)}" for o in failed
    ]
    return "\n".join(lines) + "\n"


def write_json(results: ValidationResults, path: Path) -> None:
    loads = [
        {
            "scenario": str(o.run.scenario),
            "tree": str(o.run.tree),
            "launcher": str(o.run.launcher),
            "ranks": o.run.ranks,
            "seconds": o.seconds,
            "met_expectation": o.met_expectation,
            "launch_error": o.launch_error,
            "archs": [asdict(a) for a in o.archs],
        }
        for o in results.loads
    ]
    payload = {
        "loads": loads,
        "training_parity": [asdict(p) for p in results.parities],
        "bad_inputs": [asdict(f) for f in results.faults],
    }
    path.write_text(json.dumps(payload, indent=2), encoding="utf-8")


def is_unexpected(outcome: RunOutcome) -> bool:
    """Exit non-zero for every unmet expectation: a patched case that fails, a stock case that passes where it must
    fail (or fails some other way), and a stock case that fails where it must pass (behaviour the series keeps)."""
    return not outcome.met_expectation
