"""`loadpolicy dev perf bench`: every policy's `from_pretrained` at 2 and 4 ranks, repeated; table, JSON and plot.

Each launch runs `perf/worker.py` under torchrun from a cold page cache for the checkpoint and is a row
(`perf.rows`); per (model, policy, ranks) the report gives the median (min-max) over repeats of the slowest rank's
seconds and of the largest per-rank peak, against the ideal (T/W plus the baseline). Writes OUT/bench.md,
OUT/bench.json and OUT/bench.png (`perf.writer`). What is measured and the results: docs/benchmark.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from loadpolicy.errors import CommandError, positive_int
from loadpolicy_lab.harness.launch import Tree, add_launch_arguments, launch, read_results, run_bounded, tree_env
from loadpolicy_lab.harness.procfs import evict_from_page_cache
from loadpolicy_lab.harness.trees import Workspace
from loadpolicy_lab.models.bench import FULL, SMOKE, BenchModel, build
from loadpolicy_lab.perf.cases import CASES, Case
from loadpolicy_lab.perf.contract import BenchSpec, LoadMeasurement
from loadpolicy_lab.perf.logits import REFERENCE_NAME
from loadpolicy_lab.perf.ranges import read_spans, tensor_bytes
from loadpolicy_lab.perf.rows import Row, load_row
from loadpolicy_lab.perf.writer import grouped, spread, table, values, write


# glibc's default threshold rises after large frees, and the buffers freed by merging per-expert keys then stay in the
# heap: the anonymous peak varied from run to run. Fixed, the figures repeat and show what the loader itself holds.
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1024**2)}


HOW = (
    "CPU gloo, every launch from a cold page cache. Seconds: the slowest rank (load: `from_pretrained`; + touch: and "
    "a first touch of every tensor; + initialize: and `deepspeed.initialize`, ZeRO-3 launches). Memory: the largest "
    "rank's peak RSS (anonymous + file-backed, loading and touched); ideal: T/W (the checkpoint's bytes over the "
    "ranks) plus the RSS before loading. Each figure the median (min-max) over the repeats; every launch judged "
    "against the stock one-process load's fingerprints."
)


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


def bench(where: Workspace, *, smoke: bool, repeats: int) -> list[Row]:
    """Every case on every bench model at 2 and 4 ranks (smoke: 2), `repeats` launches each: a row per launch; a
    case stops at its first failed launch."""
    out, timeout = where.out, where.timeout
    trees = where.ready_trees()
    models = SMOKE if smoke else FULL
    rows: list[Row] = []
    for ranks in (2,) if smoke else (2, 4):
        for model in models:
            path = build(model, out.resolve() / "checkpoints")
            total = tensor_bytes(read_spans(path))
            reference = reference_file(
                path, model.model_class, trees[Tree.STOCK], out.resolve() / "fingerprints" / model.name, timeout
            )
            compared = len(json.loads(reference.read_text(encoding="utf-8"))["fingerprints"])
            for case in (c for c in CASES if _applies(c, model)):
                for repeat in range(repeats):
                    spec = case.spec(ranks, path, model.model_class, reference)
                    name = f"{model.name}-{case.policy}-{case.layout}-{ranks}-{repeat}"
                    tree = trees[case.tree]
                    results = launch_load(spec, ranks, tree, out / "runs" / name, timeout)
                    row = load_row(model.name, case, ranks, total, results, tree=tree, parameters=compared)
                    rows.append(replace(row, round=repeat))
                    print(render_table(rows[-1:], header=False), flush=True)
                    if row.error:
                        break
    return rows


def _spread(launches: list[Row], measure: Callable[[Row], float | None], digits: int = 2) -> str:
    return spread(values(launches, measure), digits)


def render_table(rows: list[Row], header: bool = True) -> str:
    """Per model, case and rank count: the median (min-max) over the repeats of the slowest rank's seconds and of
    the largest rank's peak; a failed launch fails its case."""
    head = [
        "model", "policy", "ranks", "load s", "+ touch s", "+ initialize s", "peak GiB/rank", "anon / file GiB",
        "loading GiB", "touched GiB", "read GiB", "read/rank GiB", "rchar/rank GiB", "T/W + base GiB", "peak / ideal",
    ]  # fmt: skip
    lines = []
    for (model, ranks, way), launches in grouped(rows).items():
        if failed := next((r for r in launches if r.error), None):
            lines.append([model, way, str(ranks), *["-"] * 11, f"FAILED: {failed.error}"])
            continue

        memory = [r.memory for r in launches if r.memory is not None]
        lines.append(
            [
                model,
                way,
                str(ranks),
                _spread(launches, lambda r: r.load_seconds),
                _spread(launches, lambda r: r.seconds),
                _spread(launches, lambda r: r.trainable_seconds),
                _spread(launches, lambda r: r.peak_gib),
                f"{spread([m.peak_anon_gib for m in memory])} / {spread([m.peak_file_gib for m in memory])}",
                spread([m.load_peak_gib for m in memory]),
                spread([m.held_gib for m in memory]),
                spread([m.read_gib for m in memory]),
                _spread(launches, lambda r: r.read_rank_gib),
                spread([m.rchar_rank_gib for m in memory]),
                _spread(launches, lambda r: r.ideal_gib),
                _spread(launches, lambda r: r.peak_over_ideal, 3),
            ]
        )
    numeric = [False, False, *[True] * 13]
    found = table(head, numeric, lines)
    return "\n".join(found if header else found[2:])


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
    rows = bench(Workspace.of(args), smoke=args.smoke, repeats=repeats)
    command = "loadpolicy dev perf bench" + (" --smoke" if args.smoke else f" --repeats {repeats}")
    text = f"# Loading every way at bench sizes\n\n`{command}`; {HOW}\n\n{render_table(rows)}\n"
    report = write(args.out, "bench", text, rows)
    print(text)
    print(f"{len(rows)} launches in {time.monotonic() - started:.0f}s: {report}, {args.out / 'bench.json'}")
    if failed := [r for r in rows if r.error]:
        raise BenchFailedError(f"{len(failed)} benchmark launches failed: see the table above")
    return "benchmark done"


class BenchFailedError(CommandError):
    """A benchmark launch failed or selected another policy than its case."""
