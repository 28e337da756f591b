"""Launch one run with a bound, read every rank's result, and judge it (`judge`) against the scenario's expectation."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from loadpolicy_lab.harness.launch import Tree, launch
from loadpolicy_lab.harness.setup import zero3_config
from loadpolicy_lab.harness.trees import extensions_dir, prebuild_deepspeed_ops, prepare_trees
from loadpolicy_lab.matrix.cases import SCENARIOS, Run
from loadpolicy_lab.matrix.contract import MatrixCase, MatrixSpec, RankReport
from loadpolicy_lab.matrix.judge import ArchOutcome, judge
from loadpolicy_lab.models.architectures import model_classes as known_model_classes
from loadpolicy_lab.models.checkpoints import build_checkpoint, build_references
from loadpolicy_lab.models.reference import reference_path


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run: Run
    seconds: float
    archs: tuple[ArchOutcome, ...]
    launch_error: str | None = None  # timeout or a rank that wrote nothing, with where each rank was

    def as_expected(self, arch: ArchOutcome) -> bool:
        """Stock, where the scenario must fail: `arch` failed with the bug on every rank. Elsewhere: it passed."""
        if self.run.tree is Tree.STOCK and self.run.spec.stock_fails:
            return arch.failed_as_expected
        return arch.passed

    @property
    def met_expectation(self) -> bool:
        return self.launch_error is None and all(self.as_expected(arch) for arch in self.archs)


def run_scenario(
    run: Run,
    trees: dict[Tree, Path],
    checkpoints: Path,
    out: Path,
    timeout: float,
    model_classes: dict[str, str] | None = None,
) -> RunOutcome:
    """`model_classes`: the class of each generated architecture (the others are in ARCHITECTURES)."""
    out.mkdir(parents=True, exist_ok=True)
    spec = run.spec
    classes = known_model_classes(model_classes)
    cases: list[MatrixCase] = [
        {
            "arch": a,
            "checkpoint": str(checkpoints / a),
            "model_class": classes[a],
            "reference": str(reference_path(checkpoints, a, spec.bnb_8bit)),
        }
        for a in spec.archs
    ]
    worker_spec: MatrixSpec = {
        "launcher": str(run.launcher),
        "zero3": spec.zero3,
        "zero3_config": zero3_config(run.ranks),
        "distributed": run.shape.distributed_config(),
        "bnb_8bit": spec.bnb_8bit,
        "cases": cases,
    }
    launched = launch(
        "loadpolicy_lab.matrix.worker", worker_spec, trees[run.tree], out, run.ranks, timeout, launcher=run.launcher
    )
    launch_error = launched.timeout_message() if launched.timed_out else None
    ranks = [_read_rank(out, rank) for rank in range(run.ranks)]
    if launch_error is None and any(r is None for r in ranks):
        launch_error = f"launcher exited {launched.returncode}; a rank wrote no result; " + launched.where()
    tree_src = trees[run.tree].resolve() / "src"
    imported = {r.get("transformers_file") for r in ranks if r is not None}
    if launch_error is None and not all(f is not None and Path(f).is_relative_to(tree_src) for f in imported):
        launch_error = f"ranks imported transformers from {sorted(map(str, imported))}, not from {tree_src}"
    archs = tuple(judge(run, arch, ranks) for arch in spec.archs)
    return RunOutcome(run=run, seconds=launched.seconds, archs=archs, launch_error=launch_error)


def _read_rank(out: Path, rank: int) -> RankReport | None:
    path = out / f"rank{rank}.json"
    if not path.exists():
        return None
    data: RankReport = json.loads(path.read_text(encoding="utf-8"))
    return data


def prepare_matrix(out: Path, patches: Path, cache: Path, timeout: float) -> tuple[dict[Tree, Path], Path]:
    """Both trees, DeepSpeed's CPU op, every scenario's tiny checkpoint and the stock tree's reference of each."""
    trees = prepare_trees(out, patches, cache)
    extensions_dir(out)  # in the environment before the op's build and the references' process start
    import deepspeed.comm.torch  # noqa: F401, PLC0415  # imported in this thread: the build runs in another

    # the op compiles in processes of its own while the checkpoints and references are built
    with ThreadPoolExecutor(1) as pool:
        op = pool.submit(prebuild_deepspeed_ops, out)
        checkpoints = out.resolve() / "checkpoints"
        for arch in sorted({a for spec in SCENARIOS.values() for a in spec.archs}):
            build_checkpoint(arch, checkpoints)
        pairs = {(a, spec.bnb_8bit) for spec in SCENARIOS.values() for a in spec.archs}
        build_references(pairs, checkpoints, trees[Tree.STOCK], timeout)
        op.result()
    return trees, checkpoints
