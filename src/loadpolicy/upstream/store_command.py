"""`loadpolicy dev store-scaling`: time the store exchanges of a collective load at each W (docs/scaling.md)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadpolicy.errors import CommandError, missing_extra, positive_int
from loadpolicy.upstream.checkout import checkout
from loadpolicy.upstream.series import read_series
from loadpolicy.upstream.store_forms import tree_forms
from loadpolicy.upstream.store_scaling import (
    host,
    judge_record,
    measure_world,
    one_client_get_us,
    render,
    series_matches,
    start_server,
)


HELP = "the store exchanges of a collective load (agreement, load outcome) before and after, at W = 8 to 1,024"


def _worlds(text: str) -> list[int]:
    try:
        worlds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected world sizes >= 2 separated by commas, got {text!r}") from None
    if not worlds or min(worlds) < 2:
        raise argparse.ArgumentTypeError(f"expected world sizes >= 2 separated by commas, got {text!r}")
    return worlds


def _rounds_at(text: str) -> tuple[int, int]:
    world, _, rounds = text.partition("=")
    try:
        pair = int(world), int(rounds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected W=N (world size = rounds), got {text!r}") from None
    if min(pair) < 1:
        raise argparse.ArgumentTypeError(f"expected W=N with both >= 1, got {text!r}")
    return pair


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("store-scaling", help=HELP, description=__doc__)
    parser.add_argument(
        "--tree", type=Path, help="a patched checkout to import the exchanges from (default: check the series out)"
    )
    parser.add_argument("--worlds", type=_worlds, default=[8, 64, 256, 1024], help="default: 8,64,256,1024")
    parser.add_argument("--rounds", type=positive_int, default=5, help="rounds per W; every figure is their median")
    parser.add_argument(
        "--rounds-at",
        type=_rounds_at,
        action="append",
        default=[],
        metavar="W=N",
        help="N rounds at W instead (repeatable): the form before issue 62 takes minutes a round at 1,024 here",
    )
    parser.add_argument("--out", type=Path, default=Path("build/store-scaling"), help="store-scaling.{json,md} here")
    parser.add_argument("--patches", type=Path, default=Path("patches"), help="series directory (default: patches)")
    parser.add_argument("--cache", type=Path, default=Path("build/cache"), help="sdist cache (default: build/cache)")
    parser.set_defaults(handler=_run)


def _open_files(worlds: list[int]) -> None:
    """Each rank's connection is two descriptors in this process (the client's and the server's end)."""
    needed = 2 * max(worlds) + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise CommandError(f"W={max(worlds)} needs {needed} open files; the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _tree(args: argparse.Namespace) -> Path:
    if args.tree is not None:
        return Path(args.tree).resolve()
    tree = (Path(args.out) / "tree").resolve()
    shutil.rmtree(tree, ignore_errors=True)
    checkout(tree, args.patches, args.cache)
    return tree


def _commit(tree: Path) -> str:
    found = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return found.stdout.strip() or "(not a git checkout)"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> str:
    if importlib.util.find_spec("torch") is None:
        raise missing_extra("loadpolicy dev store-scaling", "torch")
    _open_files(args.worlds)
    tree = _tree(args)
    forms = tree_forms(tree)
    policy = importlib.import_module("transformers.integrations.load_policy")
    texts = [(args.patches / name).read_text(encoding="utf-8") for name in read_series(args.patches).names]
    rounds = dict.fromkeys(args.worlds, args.rounds) | dict(args.rounds_at)
    record: dict[str, Any] = {
        "command": f"loadpolicy dev store-scaling --tree {tree} --worlds {','.join(map(str, args.worlds))} "
        f"--rounds {args.rounds}" + "".join(f" --rounds-at {w}={n}" for w, n in args.rounds_at),
        "host": host(),
        "tree": f"{tree} at {_commit(tree)}",
        "tree_is_series": series_matches(forms, texts),
        "clients": "threads of one process, one TCPStore client connection each; the server in the same process",
        "worlds": args.worlds,
        "rounds": {str(world): rounds[world] for world in args.worlds},
        "cells": [],
    }
    server = start_server()
    record["one_client_get_us"] = one_client_get_us(server.port)
    for world in args.worlds:
        record["cells"] += measure_world(server.port, forms, policy, world, rounds[world], _say)
    record["load_average_at_end"] = list(os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "store-scaling.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    table = render(record) if not (problems := judge_record(record)) else ""
    (args.out / "store-scaling.md").write_text(table or "\n".join(problems) + "\n", encoding="utf-8")
    if problems:
        raise CommandError("the run failed its judge:\n" + "\n".join(problems))
    return table
