"""Training parity: K optimizer steps with EP under ZeRO-3 against the same steps in a single process.

Three ways users train after loading: `deepspeed.initialize` under torchrun (5 steps, optionally followed by
`save_checkpoint` and a reload with frozen parameters), `accelerate launch` with a ZeRO-3 config and the
transformers `Trainer` with a DeepSpeed config (3 steps each). Each runs on the patched tree, where it must match,
and on the stock tree, where it must fail (the report shows how).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadpolicy_lab.harness.launch import STOCK_DEVICE_MAP_ERROR, Launcher, Tree, launch
from loadpolicy_lab.harness.rank import RankFailure, parse, read_raw, transformers_file
from loadpolicy_lab.models.architectures import ARCHITECTURES
from loadpolicy_lab.parity.cases import FROZEN, RESUME_AFTER, ParityCase, Trainer
from loadpolicy_lab.parity.contract import UNIVERSAL_TAG, ParitySpec, Reloaded, TrainedRank
from loadpolicy_lab.parity.judge import (
    checkpoint_problems,
    compare_export,
    compare_resumed,
    compare_training,
    judge,
)
from loadpolicy_lab.training.compare import MAX_RELATIVE_DIFF, relative_diff
from loadpolicy_lab.training.contract import SingleRun


WORKER = "loadpolicy_lab.parity.worker"


@dataclass(frozen=True, slots=True)
class ParityOutcome:
    case: ParityCase
    seconds: float
    passed: bool  # met the expectation: parity on the patched tree, a failure on the stock tree
    detail: str
    max_loss_rel: float | None = None
    max_weight_rel: float | None = None


def run_parity(
    case: ParityCase,
    trees: dict[Tree, Path],
    checkpoints: Path,
    out: Path,
    timeout: float,
    references: dict[str, Path] | None = None,
) -> ParityOutcome:
    """Run `case` against its one-process reference. `references`, shared by the cases of one validation, keeps each
    reference's directory by what trains it, so cases that train the same way run it once."""
    spec = _worker_spec(case, checkpoints, out)
    _clear_earlier_outputs(spec, out)
    start = time.monotonic()
    known = {} if references is None else references
    reference, error = _reference(spec, case.ranks, trees[Tree.STOCK], out / "single", timeout, known)
    if error is None:
        error = _run_case(case, spec, trees[case.tree], out, timeout)
    if error is not None:
        return _outcome(case, start, [error])
    single = parse(read_raw(reference / "rank0.pt"), SingleRun)
    if isinstance(single, RankFailure):
        return _outcome(case, start, [f"single process: {single.error}"])
    raws = [read_raw(out / str(case.trainer) / f"rank{rank}.pt") for rank in range(case.ranks)]
    tree_src = trees[case.tree].resolve() / "src"
    imported = {transformers_file(raw) for raw in raws}
    if not all(Path(f).is_relative_to(tree_src) for f in imported):
        # Not a result about this tree at all: fail whatever the expectation.
        detail = f"ranks imported transformers from {sorted(imported)}, not from {tree_src}"
        return ParityOutcome(case, time.monotonic() - start, False, detail)
    if case.tree is Tree.STOCK:
        return _stock_outcome(case, start, raws)
    parsed = [parse(raw, TrainedRank) for raw in raws]
    errors = [f"rank {rank}: {r.error[:300]}" for rank, r in enumerate(parsed) if isinstance(r, RankFailure)]
    results = [r for r in parsed if not isinstance(r, RankFailure)]
    if errors:
        return _outcome(case, start, errors)
    if case.resumed_ranks:
        problems, loss_rel, weight_rel = _resumed_problems(case, spec, trees[case.tree], out, single, results, timeout)
        if case.checkpoint and not problems:  # what `judge` adds after the training it compares
            problems += checkpoint_problems(results)
    else:
        problems, loss_rel, weight_rel = judge(case, single, results)
    if not problems:
        problems += _after_training_problems(case, spec, trees, out, single, results, timeout)
    detail = "; ".join(problems) or _passed_detail(case, results, loss_rel, weight_rel)
    return _outcome(case, start, problems, detail, loss_rel, weight_rel)


def _clear_earlier_outputs(spec: ParitySpec, out: Path) -> None:
    """What an earlier run left in `out` (another case, when the cases change) must not be judged as this one's."""
    for written in filter(None, (spec["export_dir"], spec["checkpoint_dir"])):
        shutil.rmtree(written, ignore_errors=True)
    for unshared in out.glob("export.rank*"):  # the directories of the other ranks of an unshared export
        shutil.rmtree(unshared, ignore_errors=True)


def _passed_detail(case: ParityCase, results: list[TrainedRank], loss_rel: float, weight_rel: float) -> str:
    """What a passing case showed, after training and after what the user does next."""
    detail = f"losses {loss_rel:.1e}, weights {weight_rel:.1e} (max relative diff)"
    if case.resume:
        detail += f"; resumed from checkpoint-{RESUME_AFTER} in a new launch: same losses and final weights"
    if case.resumed_ranks:
        detail += f" (the {case.resumed_ranks}-rank launch resumed from the Universal Checkpoint, against one process)"
    if case.export:
        rise = max(r["export"]["save_peak_rise_mib"] for r in results if "export" in r)
        saved = "the adapter, every expert's, -> PeftModel.from_pretrained" if case.lora else "save_pretrained ->"
        detail += (
            f"; {saved} one-process reload on stock: every tensor within {MAX_RELATIVE_DIFF:.0e}, "
            f"names as the checkpoint's (save peak rise {rise:.1f} MiB)"
        )
    return detail


def _worker_spec(case: ParityCase, checkpoints: Path, out: Path) -> ParitySpec:
    return {
        "mode": str(case.trainer),
        "model_class": ARCHITECTURES[case.arch].model_class,
        "checkpoint": str(checkpoints / case.arch),
        "steps": case.steps,
        "lr": case.lr or (1e-1 if case.optimizer == "sgd" else 1e-3),
        "optimizer": case.optimizer,
        "distributed": case.shape.expert_parallel_config(),
        "clip": case.clip,
        "frozen": list(FROZEN) if case.checkpoint else [],
        "checkpoint_dir": str((out / "ds_checkpoint").resolve()) if case.checkpoint or case.resumed_ranks else "",
        "export_dir": str((out / "export").resolve()) if case.export else "",
        "export_unshared": case.export_unshared,
        "save_steps": RESUME_AFTER if case.resume else 0,
        "resume_from": "",
        "offload": case.offload,
        "lora": case.lora,
        "distributed_reference": case.trainer is Trainer.TRL_SFT,
        "resumed_distributed": resumed.expert_parallel_config() if (resumed := case.resumed_shape) else {},
        "resumed_steps": RESUMED_STEPS if case.resumed_ranks else 0,
    }


# What a spec holds only for the distributed run: the one-process reference trains the same without them.
_CASE_ONLY = ("mode", "offload", "checkpoint_dir", "export_dir", "export_unshared", "save_steps", "resume_from")


def _reference(
    spec: ParitySpec, ranks: int, stock: Path, directory: Path, timeout: float, references: dict[str, Path]
) -> tuple[Path, str | None]:
    """The reference on the stock tree (not the code under test): one process, or the same recipe under dense ZeRO-3
    on `ranks` ranks where the spec asks for it; its directory, and why it did not complete. A reference already run
    for the same training (model, steps, optimizer, clipping, frozen parameters, batches) is reused."""
    shape = {"ranks": ranks} if spec["distributed_reference"] else {}
    key = json.dumps({k: v for k, v in spec.items() if k not in _CASE_ONLY} | shape, sort_keys=True)
    with _REFERENCES_LOCK:  # cases run side by side (`harness/pool.py`): the second waits for the first's reference
        lock = _REFERENCE_LOCKS.setdefault(key, threading.Lock())
    with lock:
        if key in references:
            return references[key], None
        if spec["distributed_reference"]:
            error = _run_mode(spec, "trl_reference", ranks, None, stock, directory, timeout)
        else:
            error = _run_mode(spec, "single", 1, None, stock, directory, timeout)
        if error is None:
            references[key] = directory
        return directory, error


_REFERENCES_LOCK = threading.Lock()
_REFERENCE_LOCKS: dict[str, threading.Lock] = {}


def _run_case(case: ParityCase, spec: ParitySpec, tree: Path, out: Path, timeout: float) -> str | None:
    directory = out / str(case.trainer)
    return _run_mode(spec, str(case.trainer), case.ranks, case.trainer.launcher, tree, directory, timeout)


def _run_mode(
    spec: ParitySpec, mode: str, ranks: int, launcher: Launcher | None, tree: Path, out: Path, timeout: float
) -> str | None:
    """One launch of the parity worker in `mode`; why it did not complete, if it timed out."""
    launched = launch(WORKER, spec | {"mode": mode}, tree, out, ranks, timeout, launcher=launcher)
    return f"{mode}: {launched.timeout_message()}" if launched.timed_out else None


def _after_training_problems(
    case: ParityCase,
    spec: ParitySpec,
    trees: dict[Tree, Path],
    out: Path,
    single: SingleRun,
    results: list[TrainedRank],
    timeout: float,
) -> list[str]:
    """What the user does after training in new launches: resume the Trainer, save for the Hub and reload."""
    problems = []
    if case.resume:
        problems += _resume_problems(case, spec, trees[case.tree], out, results, timeout)
    if case.export and not problems:
        problems += _export_problems(spec, trees[Tree.STOCK], out / "reload", single, results, timeout)
    return problems


def _outcome(
    case: ParityCase,
    start: float,
    problems: list[str],
    detail: str = "",
    loss_rel: float | None = None,
    weight_rel: float | None = None,
) -> ParityOutcome:
    """Patched: parity is the expectation. Stock: anything that reaches here (a timeout, a crash of the reference)
    is not the known bug, so it fails too (`_stock_outcome` judges the runs that got as far as the stock ranks)."""
    text = detail or "; ".join(problems)
    passed = not problems and case.tree is Tree.PATCHED
    return ParityOutcome(case, time.monotonic() - start, passed, text, loss_rel, weight_rel)


def _stock_outcome(case: ParityCase, start: float, results: list[dict[str, Any]]) -> ParityOutcome:
    """Stock must fail on every rank with the known bug's text; training to parity, or failing otherwise, fails."""
    other = [rank for rank, r in enumerate(results) if STOCK_DEVICE_MAP_ERROR not in r.get("error", "")]
    if other:
        got = results[other[0]].get("error", "trained without an error")
        detail = f"ranks {other} did not fail with {STOCK_DEVICE_MAP_ERROR!r}: {got[:200]}"
        return ParityOutcome(case, time.monotonic() - start, False, detail)
    detail = "; ".join(f"rank {rank}: {r['error'][:120]}" for rank, r in enumerate(results))
    return ParityOutcome(case, time.monotonic() - start, True, detail)


def _export_problems(
    spec: ParitySpec, stock: Path, out: Path, single: SingleRun, results: list[TrainedRank], timeout: float
) -> list[str]:
    """The saved Hub checkpoint, reloaded in one process by the stock tree (not the code under test), must hold the
    single process's final weights, under the checkpoint's own tensor names, nothing missing or unexpected."""
    if (error := _run_mode(spec, "reload", 1, None, stock, out, timeout)) is not None:
        return [error]
    raw = read_raw(out / "rank0.pt")
    if not Path(transformers_file(raw)).is_relative_to(stock.resolve() / "src"):
        return [f"reload imported transformers from {transformers_file(raw)}, not from the stock tree"]
    reload = parse(raw, Reloaded)
    if isinstance(reload, RankFailure):
        return [f"reload: {reload.error[:300]}"]
    return compare_export(single, reload, results, adapter=spec["lora"], gathered=spec["export_unshared"])


RESUMED_STEPS = 3


def _resumed_problems(
    case: ParityCase,
    spec: ParitySpec,
    tree: Path,
    out: Path,
    single: SingleRun,
    results: list[TrainedRank],
    timeout: float,
) -> tuple[list[str], float, float]:
    """The steps before the save against the one process's first steps (losses: its weights are those after the
    resumed steps too), then a new launch at the resumed topology from the Universal Checkpoint against the rest."""
    import torch  # noqa: PLC0415

    steps = spec["steps"]
    before = torch.tensor([r["losses"] for r in results]).mean(dim=0)
    if not (relative_diff(before, torch.tensor(single["losses"][:steps])) <= MAX_RELATIVE_DIFF):
        return [f"the {case.ranks}-rank steps before the save differ from one process: {before.tolist()}"], 0.0, 0.0
    directory = out / "resumed"
    universal = str(Path(spec["checkpoint_dir"]) / UNIVERSAL_TAG)
    resumed_spec = spec | {"distributed": spec["resumed_distributed"], "resume_from": universal}
    error = _run_mode(resumed_spec, str(case.trainer), case.resumed_ranks, Launcher.TORCHRUN, tree, directory, timeout)
    if error is not None:
        return [f"resumed launch: {error}"], 0.0, 0.0
    parsed = [parse(read_raw(directory / f"rank{rank}.pt"), TrainedRank) for rank in range(case.resumed_ranks)]
    errors = [f"resumed rank {rank}: {r.error[:300]}" for rank, r in enumerate(parsed) if isinstance(r, RankFailure)]
    if errors:
        return errors, 0.0, 0.0
    after: SingleRun = {"losses": single["losses"][steps:], "weights": single["weights"]}
    return compare_training(after, [r for r in parsed if not isinstance(r, RankFailure)])


def _resume_problems(
    case: ParityCase, spec: ParitySpec, tree: Path, out: Path, results: list[TrainedRank], timeout: float
) -> list[str]:
    """A new launch resumes from the checkpoint written after RESUME_AFTER steps: its steps' losses and its final
    weights must be those of the uninterrupted run (itself judged against one process)."""
    checkpoint = out / str(case.trainer) / "trainer" / f"checkpoint-{RESUME_AFTER}"
    if not checkpoint.is_dir():
        return [f"the Trainer wrote no {checkpoint.name}"]
    directory = out / "resumed"
    resumed_spec = spec | {"save_steps": 0, "resume_from": str(checkpoint.resolve())}
    error = _run_mode(resumed_spec, str(case.trainer), case.ranks, case.trainer.launcher, tree, directory, timeout)
    if error is not None:
        return [f"resumed launch: {error}"]
    resumed = [parse(read_raw(directory / f"rank{rank}.pt"), TrainedRank) for rank in range(case.ranks)]
    return compare_resumed(results, resumed)
