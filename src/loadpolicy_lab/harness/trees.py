"""The stock and patched trees side by side, and DeepSpeed's CPU op built before any rank needs it."""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.checkout import checkout, pristine_tag
from loadpolicy_lab.harness.launch import Tree


def prepare_trees(out: Path, patches: Path, cache: Path) -> dict[Tree, Path]:
    """The patched checkout and a worktree of its pristine commit, side by side under `out/trees`."""
    trees = out.resolve() / "trees"
    shutil.rmtree(trees, ignore_errors=True)
    trees.mkdir(parents=True)
    patched = trees / "patched"
    pin = checkout(patched, patches, cache)
    pristine = trees / "stock"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(pristine), pristine_tag(pin)],
        cwd=patched,
        check=True,
        capture_output=True,
    )
    for tree in (pristine, patched):
        compile_tree(tree / "src")
    return {Tree.STOCK: pristine, Tree.PATCHED: patched}


@dataclass(frozen=True, slots=True)
class Workspace:
    """Where a run works (OUT), what it builds its trees from (the patch series, the sdist cache) and the bound on
    each of its launches: what every maintainer's run takes from its command line (`add_launch_arguments`)."""

    out: Path
    patches: Path
    cache: Path
    timeout: float

    @classmethod
    def of(cls, args: argparse.Namespace) -> Workspace:
        return cls(args.out, args.patches, args.cache, args.timeout)

    def ready_trees(self) -> dict[Tree, Path]:
        return ready_trees(self.out, self.patches, self.cache)


def ready_trees(out: Path, patches: Path, cache: Path) -> dict[Tree, Path]:
    """Both trees (`prepare_trees`) and DeepSpeed's CPU op built: what every run needs before its first launch."""
    trees = prepare_trees(out, patches, cache)
    prebuild_deepspeed_ops(out)
    return trees


def compile_tree(src: Path) -> None:
    """Write the bytecode of a tree that ranks import from source, once, before any launch.

    Ranks run with PYTHONDONTWRITEBYTECODE (tox sets it), so without this every rank of every launch compiles the
    transformers modules it imports again: about 2 s of CPU per process here, a third of a two-rank launch.
    `compileall` writes regardless of that flag; a file changed later (a mutation) no longer matches its bytecode and
    is compiled from source as before.
    """
    if not compileall.compile_dir(str(src), quiet=1, workers=0):
        raise RuntimeError(f"could not compile every module under {src}")


def extensions_dir(out: Path) -> Path:
    """Where torch builds extensions for this run (TORCH_EXTENSIONS_DIR, set here unless the environment has it)."""
    return Path(os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(out.resolve() / "torch_extensions")))


def prebuild_deepspeed_ops(out: Path) -> None:
    """Build DeepSpeed's CPU communication op once, here, before any rank needs it.

    Every rank of a launch JIT-builds it under a file lock on first use; a rank killed while holding the lock (a
    timeout, a killed-rank case) leaves the lock behind and every later launch waits on it until its bound. With no
    rank running yet, a lock found here is stale.
    """
    extensions = extensions_dir(out)
    for stale in extensions.rglob("lock"):
        stale.unlink()
    from deepspeed.comm.torch import build_shm_op  # noqa: PLC0415  # the orchestrator imports DeepSpeed only here

    build_shm_op()
