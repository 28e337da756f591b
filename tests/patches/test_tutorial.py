"""docs/tutorial.md, run as written on 2 CPU ranks, each trained checkpoint judged against one process.

Every ```sh command of the page that starts with `python examples/` or `torchrun` runs, in order, in a fresh directory
holding the repository's examples/; then the page's reload script. Each checkpoint a run saved is reloaded in one
process and compared, tensor by tensor, with plain one-process training on the same rows (each step's rows of both
ranks in one batch), the same optimizer, clipping and loss. The patched tree is the installed transformers; the
reference takes none of the series' branches (one process, no distributed config).
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
TIMEOUT_S = 300  # each run trains for seconds; a rank left in a collective is killed well before the job's bound
FENCE = "`" * 3
RANKS = 2
# float32 on CPU: the 2-rank runs differ from one process by the order of their sums (worst seen: 1.5e-6 for
# deepspeed.initialize, 9.2e-7 for TRL, 4.7e-7 for the Trainer); a reference pairing the rows otherwise, or without
# the load-balancing loss per rank, was off by more than 2e-3
TOLERANCE = 1e-5
# AdamW moves every tensor by about lr per step (3 steps at 1e-3: the least moved tensor moved 2.6e-3)
MOVED = 1e-3


def _blocks(language: str) -> list[str]:
    return re.findall(rf"{FENCE}{language}\n(.*?){FENCE}", TUTORIAL.read_text(encoding="utf-8"), re.DOTALL)


def _commands() -> list[str]:
    lines = [line.strip() for block in _blocks("sh") for line in block.splitlines()]
    return [line for line in lines if line.startswith(("python examples/", "torchrun"))]


def _script(line: str) -> str:
    return next(Path(word).name for word in shlex.split(line) if word.endswith(".py"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_run_here(line: str) -> list[str]:
    """A command of the page with this interpreter, bounded; torchrun on a free port."""
    words = shlex.split(line)
    if words[0] == "python":
        command = [sys.executable, *words[1:]]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", f"--master-port={_free_port()}", *words[1:]]
    return ["timeout", "--kill-after=10", str(TIMEOUT_S), *command]


@dataclass(frozen=True)
class Run:
    line: str
    result: subprocess.CompletedProcess[str]

    def tail(self) -> str:
        """The command and the end of its output (torchrun names a failing rank and its traceback there)."""
        out, err = self.result.stdout[-3000:], self.result.stderr[-6000:]
        return f"{self.line}: exit {self.result.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def _run(line: str, work: Path) -> Run:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        _as_run_here(line), cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S + 30, check=False
    )
    return Run(line, result)


@dataclass(frozen=True)
class Recipe:
    """What a script trains on and with: `batches` gives, for a vocabulary size, each step's rows of both ranks in
    rank order; AdamW at lr 1e-3 with this weight decay, gradients clipped at 1.0."""

    batches: Callable[[int], list[Any]]
    weight_decay: float
    aux_per_rank: bool  # TRL: each rank adds the load-balancing loss over its own rows


def _readme_batches(vocab: int) -> list[Any]:
    """train_ep_zero3.py: rank r draws its row of each step from a generator seeded r."""
    import torch

    generators = [torch.Generator().manual_seed(rank) for rank in range(RANKS)]
    return [torch.cat([torch.randint(0, vocab, (1, 16), generator=g) for g in generators]) for _ in range(3)]


def _trainer_batches(vocab: int) -> list[Any]:
    """The Trainer scripts: 6 rows from a generator seeded 0. The sequential sampler, sharded by accelerate over the
    ranks one row each, gives step s rows 2s (rank 0) and 2s + 1 (rank 1); seen by printing each rank's rows."""
    import torch

    rows = torch.randint(0, vocab, (6, 16), generator=torch.Generator().manual_seed(0))
    return [rows[step * RANKS : (step + 1) * RANKS] for step in range(len(rows) // RANKS)]


RECIPES = {
    "train_ep_zero3.py": Recipe(_readme_batches, weight_decay=0.01, aux_per_rank=False),  # torch AdamW's default
    "train_trainer.py": Recipe(_trainer_batches, weight_decay=0.0, aux_per_rank=False),
    "train_trl.py": Recipe(_trainer_batches, weight_decay=0.0, aux_per_rank=True),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Run]]:
    """The page's commands in order, in a fresh directory; the training runs by script, failed or not."""
    work = tmp_path_factory.mktemp("tutorial")
    (work / "examples").symlink_to(ROOT / "examples")
    build, *trainings = _commands()
    assert _script(build) == "tiny_moe.py", build
    built = _run(build, work)
    assert built.result.returncode == 0, built.tail()
    # every later test says which of them failed, with its output
    return work, {_script(line): _run(line, work) for line in trainings}


def test_the_page_runs_and_links_each_training_script() -> None:
    page = TUTORIAL.read_text(encoding="utf-8")
    commands = _commands()
    assert [_script(line) for line in commands] == ["tiny_moe.py", *RECIPES], commands
    for line in commands[1:]:
        assert line.startswith(f"torchrun --nproc-per-node {RANKS} examples/"), line  # the recipes' world size
    for script in ["tiny_moe.py", *RECIPES]:
        assert f"](../examples/{script})" in page, script


def _one_process(checkpoint: Path, recipe: Recipe) -> dict[str, Any]:
    """The recipe's steps in one process on each step's rows of both ranks. The `Trainer` divides each rank's summed
    token loss by the token count of both ranks and multiplies it by the world size, and DeepSpeed averages the
    ranks' gradients (as it does the README example's per-rank means): the mean over both rows' tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=recipe.weight_decay)
    for batch in recipe.batches(model.config.vocab_size):
        loss = model(input_ids=batch, labels=batch).loss
        if recipe.aux_per_rank:
            # TRL adds the load-balancing loss of each rank's own row, unscaled; DeepSpeed averages the ranks
            aux = torch.stack([model(input_ids=row[None], output_router_logits=True).aux_loss for row in batch])
            loss = loss + model.config.router_aux_loss_coef * aux.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    return {name: tensor.detach() for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize("script", sorted(RECIPES))
def test_each_run_trains_like_one_process_and_saves_a_checkpoint_one_process_loads(
    runs: tuple[Path, dict[str, Run]], script: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    work, by_script = runs
    run = by_script.get(script)
    assert run is not None, f"docs/tutorial.md runs no {script}"
    assert run.result.returncode == 0, run.tail()
    checkpoint, out = (work / word for word in shlex.split(run.line)[-2:])
    saved, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), f"{run.line}: reloading {out} in one process: {info}"
    saved = saved.state_dict()
    before = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).state_dict()
    reference = _one_process(checkpoint, RECIPES[script])
    assert sorted(saved) == sorted(reference), run.line
    differences = {name: float((saved[name] - reference[name]).abs().max()) for name in reference}
    off = {name: d for name, d in differences.items() if not d <= TOLERANCE}  # NaN fails too
    assert not off, f"{run.line}: off one process by more than {TOLERANCE}: {off}\n{run.tail()}"
    moved = {name: float((reference[name] - before[name]).abs().max()) for name in reference}
    still = {name: m for name, m in moved.items() if not m > MOVED}
    assert not still, f"{run.line}: tensors the reference moved by {MOVED} or less: {still}"


def test_the_reload_script_loads_every_output_in_one_process(runs: tuple[Path, dict[str, Run]]) -> None:
    work, by_script = runs
    assert all(run.result.returncode == 0 for run in by_script.values()), "a training run failed (its test says how)"
    (script,) = _blocks("python")
    (work / "reload.py").write_text(script, encoding="utf-8")
    reloaded = _run("python reload.py", work)
    assert reloaded.result.returncode == 0, reloaded.tail()
    for run in by_script.values():
        out = shlex.split(run.line)[-1]
        assert f"{out} generates" in reloaded.result.stdout, reloaded.tail()
