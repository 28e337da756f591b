"""`loadpolicy dev perf bench`: every policy's `from_pretrained` at 2 and 4 ranks, repeated; table, JSON and plot.

Each launch runs `bench/worker.py` under torchrun from a cold page cache for the checkpoint. Per (model, policy,
ranks) the report gives the median (min-max) over repeats of the slowest rank's load time and of the largest per-rank
peak, against the ideal (owned bytes plus the baseline). What is measured and the results: docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from loadpolicy.errors import CommandError, positive_int
from loadpolicy.units import GIB
from loadpolicy_lab.harness.launch import Tree, add_launch_arguments, launch, read_results, run_bounded, tree_env
from loadpolicy_lab.harness.procfs import evict_from_page_cache
from loadpolicy_lab.harness.trees import prebuild_deepspeed_ops, prepare_trees
from loadpolicy_lab.models.bench import FULL, SMOKE, BenchModel, build, parameter_count
from loadpolicy_lab.perf.cases import CASES, Case
from loadpolicy_lab.perf.contract import BenchSpec, LoadMeasurement
from loadpolicy_lab.perf.judge import judge
from loadpolicy_lab.perf.logits import REFERENCE_NAME


# glibc's default threshold rises after large frees, and the buffers freed by merging per-expert keys then stay in the
# heap: the anonymous peak varied from run to run. Fixed, the figures repeat and show what the loader itself holds.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1024**2)}


def _applies(case: Case, model: BenchModel) -> bool:
    return not (case.moe_only and not model.moe) and not (case.dense_only and model.moe)


def reference_file(checkpoint: Path, model_class: str, stock: Path, out: Path, timeout: float) -> Path:
    """The checkpoint's fingerprints from a one-process load on the stock tree, computed once per checkpoint."""
    return one_process(
        checkpoint, model_class, stock, out / "fingerprints.json", timeout, "loadpolicy_lab.perf.fingerprint"
    )


def logits_reference_file(checkpoint: Path, model_class: str, stock: Path, out: Path, timeout: float) -> Path:
    """The checkpoint's logits on the fixed prompt from one-process forwards on the stock tree (`perf.logits`),
    computed once per checkpoint."""
    return one_process(checkpoint, model_class, stock, out / REFERENCE_NAME, timeout, "loadpolicy_lab.perf.logits")


def one_process(checkpoint: Path, model_class: str, stock: Path, path: Path, timeout: float, module: str) -> Path:
    newest = max(f.stat().st_mtime for f in checkpoint.iterdir())
    if path.exists() and path.stat().st_mtime > newest:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.with_suffix(".log")
    command = [sys.executable, "-m", module, str(checkpoint), model_class, str(path)]
    returncode = run_bounded(command, tree_env(stock), log, timeout)
    if returncode != 0 or not path.exists():
        why = "timed out" if returncode is None else f"exited {returncode}"
        raise BenchFailedError(f"the reference {path.name} of {checkpoint} {why}: see {log}")
    return path


def launch_load(
    spec: BenchSpec, ranks: int, tree: Path, out: Path, timeout: float, env: Mapping[str, str] | None = None
) -> list[LoadMeasurement] | str:
    """One benchmark load from a cold page cache: every rank's measurement, or why the launch has none. `env` adds
    to the launch's environment."""
    if spec["checkpoint"]:
        evict_from_page_cache(Path(spec["checkpoint"]))
    launched = launch(
        "loadpolicy_lab.perf.worker", spec, tree, out, ranks, timeout, env={**FIXED_MALLOC, **(env or {})}
    )
    return read_results(launched, LoadMeasurement)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    parameters: int
    case: str
    ranks: int
    repeats: int
    seconds: dict[str, float]  # slowest rank, per repeat
    peak_gib: dict[str, float]  # largest per-rank peak RSS (anonymous + file-backed), per repeat
    peak_anon_gib: dict[str, float]
    peak_file_gib: dict[str, float]
    held_gib: dict[str, float]  # resident after loading and touching every parameter
    load_peak_gib: dict[str, float]  # largest per-rank peak RSS sampled during from_pretrained only
    read_gib: dict[str, float]  # bytes read from storage, summed over ranks
    read_rank_gib: dict[str, float]  # the most one rank read from storage
    rchar_rank_gib: dict[str, float]  # the most one rank's read calls returned while loading
    ideal_gib: float  # largest per-rank (owned bytes + baseline RSS)
    peak_over_ideal: float
    owned_gib: float = 0.0  # largest per-rank bytes of the tensors it holds
    baseline_anon_gib: float = 0.0  # RSS before from_pretrained, on the rank with the largest, median over repeats
    baseline_file_gib: float = 0.0
    error: str | None = None
    # slowest rank's load plus first touch of every tensor, per repeat: when its bytes are in memory, for every policy
    ready_seconds: dict[str, float] = field(default_factory=dict)
    # ... plus `deepspeed.initialize(model)`, ZeRO-3 launches: how long until training can start
    initialized_seconds: dict[str, float] = field(default_factory=dict)


def _peak(rank: dict[str, Any], kind: str) -> float:
    """The rank's peak of one kind of memory: during loading, or once every loaded tensor was touched."""
    return float(max(rank[f"peak_{kind}"], rank[f"held_{kind}"]))


def _row(model: BenchModel, params: int, case: Case, ranks: int, runs: list[list[LoadMeasurement]]) -> Row:
    def per_repeat(figure: Any, combine: Any = max) -> dict[str, float]:
        return _summary([combine(figure(r) for r in ranks_) / GIB for ranks_ in runs])

    seconds = _summary([max(r["seconds"] for r in ranks_) for ranks_ in runs])
    ready = _summary([max(r["seconds"] + r["touch_seconds"] for r in ranks_) for ranks_ in runs])
    initialized = (
        _summary(
            [
                max(r["seconds"] + r["touch_seconds"] + (r["initialize_seconds"] or 0.0) for r in ranks_)
                for ranks_ in runs
            ]
        )
        if all(r["initialize_seconds"] is not None for ranks_ in runs for r in ranks_)
        else {}
    )
    ideal = statistics.median(max(r["owned_bytes"] + r["rss_before"] for r in ranks_) for ranks_ in runs) / GIB
    peak = per_repeat(lambda r: _peak(r, "total"))
    before = [max(ranks_, key=lambda r: r["rss_before"]) for ranks_ in runs]
    return Row(
        model=model.name,
        parameters=params,
        case=case.label,
        ranks=ranks,
        repeats=len(runs),
        seconds=seconds,
        ready_seconds=ready,
        initialized_seconds=initialized,
        peak_gib=peak,
        peak_anon_gib=per_repeat(lambda r: _peak(r, "anon")),
        peak_file_gib=per_repeat(lambda r: _peak(r, "file")),
        held_gib=per_repeat(lambda r: r["held_total"]),
        load_peak_gib=per_repeat(lambda r: r["peak_total"]),
        read_gib=per_repeat(lambda r: r["read_bytes"], sum),
        read_rank_gib=per_repeat(lambda r: r["read_bytes"]),
        rchar_rank_gib=per_repeat(lambda r: r["rchar"]),
        ideal_gib=ideal,
        peak_over_ideal=peak["median"] / ideal,
        owned_gib=max(r["owned_bytes"] for r in runs[0]) / GIB,
        baseline_anon_gib=statistics.median(r["anon_before"] for r in before) / GIB,
        baseline_file_gib=statistics.median(r["file_before"] for r in before) / GIB,
    )


def bench(out: Path, patches: Path, cache: Path, *, smoke: bool, repeats: int, timeout: float) -> list[Row]:
    trees = prepare_trees(out, patches, cache)
    prebuild_deepspeed_ops(out)
    models = SMOKE if smoke else FULL
    rows: list[Row] = []
    for ranks in (2,) if smoke else (2, 4):
        for model in models:
            path = build(model, out.resolve() / "checkpoints")
            params = parameter_count(path)
            reference = reference_file(
                path, model.model_class, trees[Tree.STOCK], out.resolve() / "fingerprints" / model.name, timeout
            )
            compared = len(json.loads(reference.read_text(encoding="utf-8"))["fingerprints"])
            for case in (c for c in CASES if _applies(c, model)):
                runs, error = [], None
                for repeat in range(repeats):
                    spec = case.spec(ranks, path, model.model_class, reference)
                    name = f"{model.name}-{case.policy}-{case.layout}-{ranks}-{repeat}"
                    results = launch_load(spec, ranks, trees[case.tree], out / "runs" / name, timeout)
                    if isinstance(results, str):
                        error = results
                        break
                    error = "; ".join(judge(case, results, trees[case.tree], compared))[:300] or None
                    if error:
                        break
                    runs.append(results)
                row = (
                    _row(model, params, case, ranks, runs)
                    if not error
                    else Row(
                        model.name,
                        params,
                        case.label,
                        ranks,
                        0,
                        {},
                        {},
                        {},
                        {},
                        {},
                        {},
                        {},
                        {},
                        {},
                        0.0,
                        0.0,
                        error=error,
                    )
                )
                rows.append(row)
                print(render_table([row], header=False), flush=True)
    return rows


def render_table(rows: list[Row], header: bool = True) -> str:
    lines = []
    # "loading": the peak during from_pretrained; "touched": the RSS once every loaded tensor was touched
    if header:
        lines.append(
            f"{'model':<11} {'policy':<30} {'ranks':>5} {'load s (min-max)':>20} {'+touch s':>8} {'+init s':>7} "
            f"{'peak GiB/rank':>22} {'anon/file':>11} {'loading':>7} {'touched':>7} {'read GiB':>8} {'read/rank':>9} "
            f"{'rchar/rank':>10} {'ideal':>6} {'peak/ideal':>10}"
        )
    for r in rows:
        if r.error:
            lines.append(f"{r.model:<11} {r.case:<30} {r.ranks:>5} FAILED: {r.error}")
            continue
        s, p = r.seconds, r.peak_gib
        lines.append(
            f"{r.model:<11} {r.case:<30} {r.ranks:>5} {s['median']:>7.2f} ({s['min']:.2f}-{s['max']:.2f}) "
            f"{r.ready_seconds.get('median', float('nan')):>8.2f} "
            f"{r.initialized_seconds.get('median', float('nan')):>7.2f} "
            f"{p['median']:>9.2f} ({p['min']:.2f}-{p['max']:.2f}) "
            f"{r.peak_anon_gib['median']:>5.2f}/{r.peak_file_gib['median']:<5.2f} "
            f"{r.load_peak_gib['median']:>7.2f} {r.held_gib['median']:>7.2f} "
            f"{r.read_gib['median']:>8.2f} {r.read_rank_gib['median']:>9.2f} {r.rchar_rank_gib['median']:>10.2f} "
            f"{r.ideal_gib:>6.2f} {r.peak_over_ideal:>10.2f}"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib  # noqa: PLC0415  # only the bench environment installs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    models = sorted({r.model for r in rows})
    figure, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 8), squeeze=False)
    for column, model in enumerate(models):
        for case in CASES:
            points = sorted((r.ranks, r) for r in rows if r.model == model and r.case == case.label and not r.error)
            if not points:
                continue
            ranks = [n for n, _ in points]
            axes[0][column].plot(ranks, [r.peak_gib["median"] for _, r in points], marker="o", label=case.label)
            axes[1][column].plot(ranks, [r.seconds["median"] for _, r in points], marker="o", label=case.label)
        ideal = sorted({(r.ranks, r.ideal_gib) for r in rows if r.model == model and "EPMeta" in r.case})
        if ideal:
            axes[0][column].plot(*zip(*ideal, strict=True), linestyle="--", color="grey", label="ideal (EPMeta)")
        axes[0][column].set_title(f"{model}: peak RSS per rank (GiB)")
        axes[1][column].set_title(f"{model}: from_pretrained (s, slowest rank)")
        for axis in (axes[0][column], axes[1][column]):
            axis.set_xlabel("ranks")
            axis.set_xticks(sorted({r.ranks for r in rows}))
            axis.grid(alpha=0.3)
            axis.set_ylim(bottom=0)
            axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("bench", help="time and peak memory per rank of from_pretrained, every policy")
    parser.add_argument("--smoke", action="store_true", help="tiny models at 2 ranks, once: proves the bench works")
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    add_launch_arguments(parser, timeout=300.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    started = time.monotonic()
    repeats = 1 if args.smoke else args.repeats
    rows = bench(args.out, args.patches, args.cache, smoke=args.smoke, repeats=repeats, timeout=args.timeout)
    (args.out / "bench.json").write_text(json.dumps([asdict(r) for r in rows], indent=2), encoding="utf-8")
    plot(rows, args.out / "bench.png")
    table = render_table(rows)
    (args.out / "bench.txt").write_text(table + "\n", encoding="utf-8")
    failed = [r for r in rows if r.error]
    print(table)
    print(
        f"{len(rows)} rows in {time.monotonic() - started:.0f}s: {args.out / 'bench.json'}, {args.out / 'bench.png'}"
    )
    if failed:
        raise BenchFailedError(f"{len(failed)} benchmark cases failed: see the table above")
    return "benchmark done"


class BenchFailedError(CommandError):
    """A benchmark launch failed or selected another policy than its case."""
