"""`loadpolicy dev throughput`: training tokens/s per rank of each way to train an MoE under ZeRO-3.

Launches `throughput.worker` for every way (`cases.Way`) on the same checkpoint, world and ep, and tabulates
tokens/s per rank, where a step's time goes, the collectives and the peak RSS. The judge fails a run whose ways train
the same data but whose losses differ by more than `LOSS_BOUND`; speed is reported, never asserted. Method and
results: docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path

from loadpolicy.errors import positive_int
from loadpolicy_lab.harness.launch import ValidationFailedError, add_launch_arguments, launch, read_results
from loadpolicy_lab.harness.trees import Workspace
from loadpolicy_lab.models.bench import FULL, SMOKE, BenchModel
from loadpolicy_lab.models.bench import build as build_model
from loadpolicy_lab.throughput.cases import Way
from loadpolicy_lab.throughput.contract import ThroughputRank, ThroughputSpec
from loadpolicy_lab.throughput.judge import LOSS_BOUND, Row, judge, row_of, same_data_rounds, worst_loss_difference


WORKER = "loadpolicy_lab.throughput.worker"


def throughput(
    where: Workspace,
    *,
    model: BenchModel,
    ways: tuple[str, ...] = tuple(Way),
    experts_implementation: str | None = None,
    adamw: str = "fused",
    repeats: int = 1,
    ranks: int,
    eps: tuple[int, ...],
    steps: int,
    sequence: int,
) -> list[Row]:
    out, timeout = where.out, where.timeout
    trees = where.ready_trees()
    checkpoint = build_model(model, out.resolve() / "checkpoints")
    config = model.transformers_config()
    rows = []
    # Rounds interleave the ways, so that a slow spell of this shared machine falls on every way of a round alike
    for repeat, ep in ((repeat, ep) for repeat in range(repeats) for ep in eps):
        # alternate the order of the ways from round to round: no way always runs first on a warming machine
        order = list(Way) if repeat % 2 == 0 else list(reversed(Way))
        for way in order:
            if way not in ways or (way is Way.ZERO3 and ep != eps[0]):
                continue  # no EP: one run serves every ep
            shape = way.shape(ranks, ep)
            spec: ThroughputSpec = {
                "way": str(way),
                "ep": ep,
                "distributed": shape.distributed_config(),
                "checkpoint": str(checkpoint),
                "model_class": model.model_class,
                "model_type": config.model_type,
                "vocab_size": config.vocab_size,
                "micro_batch": 1,
                "sequence": sequence,
                "warmup": 1,
                "steps": steps,
                "experts_implementation": experts_implementation,
                "adamw": adamw,
            }
            start = time.monotonic()
            directory = out / "runs" / (f"{way}-ep{ep}" + (f"-{repeat}" if repeats > 1 else ""))
            result = read_results(launch(WORKER, spec, trees[way.tree], directory, ranks, timeout), ThroughputRank)
            seconds = time.monotonic() - start
            row = (
                Row(way, ranks, ep, seconds, error=result, repeat=repeat)
                if isinstance(result, str)
                else replace(row_of(way, shape, ep, seconds, result), repeat=repeat)
            )
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _line(r: Row) -> str:
    if r.error:
        return f"{r.way:<9} x{r.ranks} ep {r.ep}: FAILED {r.error}"
    return (
        f"{r.way:<9} x{r.ranks} ep {r.ep}: {r.tokens_per_s_per_rank:8.1f} tokens/s/rank, step {r.step_s:.2f}s "
        f"(fwd {r.forward_s:.2f} bwd {r.backward_s:.2f} opt {r.optimizer_s:.2f}), first loss {r.first_loss:.5f}"
    )


def dispatch_against_autoep(rows: list[Row]) -> dict[int, list[float]]:
    """Per ep, token dispatch's tokens/s per rank over DeepSpeed AutoEP's in each round that measured both."""
    ratios: dict[int, list[float]] = {}
    for r in rows:
        if r.way != "dispatch" or r.tokens_per_s_per_rank is None:
            continue
        autoep = next((a for a in rows if a.way == "autoep" and (a.ep, a.repeat) == (r.ep, r.repeat)), None)
        if autoep is not None and autoep.tokens_per_s_per_rank:
            ratios.setdefault(r.ep, []).append(r.tokens_per_s_per_rank / autoep.tokens_per_s_per_rank)
    return ratios


def render_markdown(rows: list[Row], command: str, model: str, sequence: int) -> str:
    rounds = len({r.repeat for r in rows}) > 1
    lines = [
        f"`{command}`: {model}, float32, micro-batch 1 x {sequence} tokens per rank, gloo on CPU (OMP_NUM_THREADS=1).",
        "",
        ("| round " if rounds else "")
        + "| way | experts kernel | ranks | ep | tokens/s per rank | vs tp = ep | step s | forward | backward "
        "| optimizer "
        "| collectives in one step, s | peak RSS training, GiB (per rank) | first loss |",
        ("|---:" if rounds else "") + "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        first = f"| {r.repeat + 1} " if rounds else ""
        if r.error:
            lines.append(f"{first}| {r.way} | - | {r.ranks} | {r.ep} | FAILED: {r.error[:200]} | | | | | | | | |")
            continue
        base = next(
            (
                b.tokens_per_s_per_rank
                for b in rows
                if b.way == "tp_ep" and (b.ep, b.repeat) == (r.ep, r.repeat) and not b.error
            ),
            None,
        )
        mine = r.tokens_per_s_per_rank
        ratio = f"{mine / base:.2f}x" if base and mine is not None else "-"
        collectives = ", ".join(f"{k} {v:.2f}" for k, v in r.collectives_s.items() if v >= 0.005) or "-"
        lines.append(
            f"{first}| {r.way} | {r.experts_kernel} | {r.ranks} | {r.ep if r.way != 'zero3' else '-'} "
            f"| {r.tokens_per_s_per_rank:.1f} "
            f"| {ratio} | {r.step_s:.2f} | {r.forward_s:.2f} | {r.backward_s:.2f} | {r.optimizer_s:.2f} "
            f"| {collectives} | {' / '.join(f'{g:.2f}' for g in r.peak_training_gib)} | {r.first_loss:.5f} |"
        )
    for (repeat, ep), (reference, others) in same_data_rounds(rows).items():
        judged = [f"{r.way} {worst_loss_difference(r, reference):.1e}" for r in others if reference and not r.error]
        if reference is not None and not reference.error and judged:
            where = f" (round {repeat + 1}, ep {ep})" if rounds else ""
            lines.append(
                f"\nLosses at every step{where} against {reference.way}'s ({len(reference.losses)} steps, bound "
                f"{LOSS_BOUND:.0e}), worst relative difference: {', '.join(judged)}"
            )
    for ep, ratios in sorted(dispatch_against_autoep(rows).items()):
        lines.append(
            f"\nToken dispatch against DeepSpeed AutoEP at ep {ep}: "
            + ", ".join(f"{x:.2f}x" for x in ratios)
            + (f" (median {statistics.median(ratios):.2f}x over {len(ratios)} rounds)" if len(ratios) > 1 else "")
        )
    return "\n".join(lines) + "\n"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "throughput", help="training tokens/s per rank: token dispatch vs tp = ep vs DeepSpeed AutoEP vs plain ZeRO-3"
    )
    parser.add_argument("--out", type=Path, default=Path("build/throughput"), help="work and report directory")
    parser.add_argument("--smoke", action="store_true", help="the CI size: a tiny MoE at 2 ranks, ep 2")
    parser.add_argument("--ranks", type=positive_int, default=4, help="world size (default 4)")
    parser.add_argument(
        "--ep", type=positive_int, action="append", help="expert-parallel size (repeatable; default 4 and 2)"
    )
    parser.add_argument(
        "--steps", type=positive_int, default=3, help="measured steps after one warm-up step (default 3)"
    )
    parser.add_argument("--sequence", type=positive_int, default=512, help="tokens per micro-batch (default 512)")
    parser.add_argument("--way", action="append", choices=list(Way), help="only this way (repeatable; default all)")
    parser.add_argument(
        "--experts-implementation",
        choices=("eager", "grouped_mm"),
        help="transformers' experts forward for the ways that keep it (default: transformers' choice)",
    )
    parser.add_argument(
        "--adamw",
        choices=("for-loop", "fused"),
        default="fused",
        help="torch AdamW for every way: `fused=True` (default), or torch's CPU default, which loops over the tensors",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=1,
        help="interleaved rounds of every way (default 1; one row per round)",
    )
    add_launch_arguments(parser, timeout=900.0)
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    model = SMOKE[0] if args.smoke else FULL[0]
    ranks = 2 if args.smoke else args.ranks
    eps = (2,) if args.smoke else tuple(args.ep or (ranks, 2))
    sequence = 64 if args.smoke else args.sequence
    started = time.monotonic()
    rows = throughput(
        Workspace.of(args),
        model=model,
        ways=tuple(args.way or Way),
        experts_implementation=args.experts_implementation,
        adamw=args.adamw,
        repeats=args.repeats,
        ranks=ranks,
        eps=eps,
        steps=args.steps,
        sequence=sequence,
    )
    command = (
        "loadpolicy dev throughput"
        + (" --smoke" if args.smoke else "")
        + "".join(f" --way {w}" for w in args.way or ())
    )
    command += "".join(f" --ep {ep}" for ep in args.ep or ())
    # every option that differs from its default, so that the command reproduces the table
    for option, value, default in (
        ("--ranks", args.ranks, 4),
        ("--steps", args.steps, 3),
        ("--sequence", args.sequence, 512),
        ("--experts-implementation", args.experts_implementation, None),
        ("--adamw", args.adamw, "fused"),
        ("--repeats", args.repeats, 1),
    ):
        if value != default and not (args.smoke and option in ("--ranks", "--sequence")):  # smoke sets these
            command += f" {option} {value}"
    (args.out / "throughput.json").write_text(json.dumps([asdict(r) for r in rows], indent=2), encoding="utf-8")
    problems = judge(rows)
    table = render_markdown(rows, command, model.name, sequence)
    print(table)
    if problems:  # a table whose judge failed is not published as one
        failed = "**Not judged equal, do not cite:**\n\n" + "".join(f"- {p}\n" for p in problems) + "\n" + table
        (args.out / "throughput-failed.md").write_text(failed, encoding="utf-8")
        raise ValidationFailedError("; ".join(problems))
    (args.out / "throughput.md").write_text(table, encoding="utf-8")
    return f"{len(rows)} runs in {time.monotonic() - started:.0f}s: {args.out / 'throughput.md'}"
