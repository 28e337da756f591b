"""`loadpolicy plan`: predict one launch's loading cost, or project it for published models.

- `loadpolicy plan launch --model Qwen3-30B-A3B --policy EPMeta --ranks 4 --ep 4 --device gpu` (or `--config
  config.json`): per-rank figures with the reason for each.
- `loadpolicy plan project --out build/plan`: the published MoE models at 4 to 64 ranks, every policy: table + plot.

The model is calibrated against the benchmark by `loadpolicy dev perf calibrate` (`perf.calibrate`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadpolicy.errors import CommandError, missing_extra, non_negative_float, positive_int
from loadpolicy.plan.configs import PUBLISHED, published_config
from loadpolicy.plan.cost import Device, Launch, Plan, predict
from loadpolicy.plan.inventory import DTYPE_BYTES, inventory_from_config
from loadpolicy.plan.project import plot_projection, project, render_projection
from loadpolicy.policy import PolicyName, parse_policy_name
from loadpolicy.shape import LaunchShape
from loadpolicy.units import GIB


def render_plan(plan: Plan, baseline: int = 0) -> str:
    inv, launch = plan.inventory, plan.launch
    lines = [
        f"{inv.model_type}: {inv.parameters / 1e9:.2f}B parameters in {inv.dtype} = {inv.total_bytes / GIB:.2f} GiB "
        f"(dense {inv.dense_bytes / GIB:.2f}, experts {inv.expert_bytes / GIB:.2f}, {inv.num_experts} experts)",
        f"{launch.policy} on {launch.ranks} {launch.device} ranks, ep={launch.ep}, tp={launch.tp}, dp={launch.dp}"
        + (f"; host figures include a baseline of {baseline / GIB:.2f} GiB" if baseline else ""),
    ]
    bottleneck = plan.bottleneck(baseline)
    for cost in plan.ranks:
        mark = "  <- bottleneck" if cost is bottleneck and len(plan.ranks) > 1 else ""
        lines.append(f"rank(s) {cost.ranks}:{mark}")
        figures = [
            ("reads", cost.read),
            ("peak host anonymous", cost.peak_anon),
            ("peak host file-backed", cost.peak_file),
            ("peak device", cost.peak_device),
            ("held after from_pretrained", cost.held),
            ("host resident after (touched)", cost.resident),
        ]
        if cost.held_after_deepspeed is not None:
            figures.append(("held after deepspeed.initialize", cost.held_after_deepspeed))
        lines += [f"  {label:<32} {fig.nbytes / GIB:>9.2f} GiB  {fig.why}" for label, fig in figures]
        lines.append(f"  {'peak host total':<32} {cost.peak_host(baseline) / GIB:>9.2f} GiB")
    return "\n".join(lines)


def launch_shape(args: argparse.Namespace) -> LaunchShape:
    """The launch the arguments describe: `--ep E` is `DistributedConfig(tp_size=E, ep_size=E)` on each of
    `ranks / E` data-parallel replicas, or with `--dispatch` `DistributedConfig(fsdp_size=ranks, ep_size=E)` (token
    dispatch: the same loading, every rank its own batch); asking for Zero3Init or EPMeta implies a ZeRO-3 config."""
    requested = parse_policy_name(args.policy) if args.policy else None
    zero3 = args.zero3 or requested in (PolicyName.ZERO3_INIT, PolicyName.EP_META)
    if args.dispatch and args.ep > 1:
        shape = LaunchShape.dispatching(args.ranks, args.ep, zero3=zero3, requested=requested)
    else:
        shape = LaunchShape.experts_over(args.ranks, args.ep, zero3=zero3, requested=requested)
    return dataclasses.replace(shape, flat_partitions=not args.gather_and_copy)


def _inventory(args: argparse.Namespace) -> Any:
    try:
        return inventory_from_config(published_config(args.model) if args.model else args.config, args.dtype)
    except ModuleNotFoundError as exc:
        raise missing_extra("loadpolicy plan launch", exc.name or "transformers") from None
    except ValueError as exc:  # AutoConfig: an unknown model_type, or fields its config class refuses
        raise CommandError(f"--config {str(args.config)!r}: transformers cannot build this config: {exc}") from None


def _run_launch(args: argparse.Namespace) -> str:
    inventory = _inventory(args)
    launch = Launch(launch_shape(args), Device(args.device), per_expert_keys=not args.fused_checkpoint)
    plan = predict(launch, inventory)
    if args.json:
        described = asdict(launch) | {"policy": launch.policy, "ep": launch.ep, "tp": launch.tp, "dp": launch.dp}
        return json.dumps({"launch": described, "ranks": [asdict(r) for r in plan.ranks]}, indent=2)
    return render_plan(plan, int(args.baseline_gib * GIB))


def _run_project(args: argparse.Namespace) -> str:
    rows = project(tuple(args.models), tuple(args.ranks))
    text = render_projection(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "projection.md").write_text(text + "\n", encoding="utf-8")
    (args.out / "projection.json").write_text(json.dumps([asdict(r) for r in rows], indent=2), encoding="utf-8")
    if args.no_plot:
        return text + f"\n\n{args.out / 'projection.md'}"
    try:
        plot_projection(rows, args.out / "projection.png")
    except ModuleNotFoundError as exc:
        raise CommandError(
            f"the plot needs {exc.name!r}, which is not installed (the table is written: "
            f"{args.out / 'projection.md'}); accepted: pip install matplotlib, or --no-plot"
        ) from None
    return text + f"\n\n{args.out / 'projection.md'}, {args.out / 'projection.png'}"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("plan", help="loading cost model: one launch's figures, published models projected")
    modes = parser.add_subparsers(dest="mode", required=True, metavar="MODE")

    launch = modes.add_parser("launch", help="per-rank figures for one launch")
    source = launch.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", choices=sorted(PUBLISHED), help="a published model's hyperparameters")
    source.add_argument("--config", type=Path, help="a config.json (or a directory holding one)")
    launch.add_argument(
        "--policy", help=f"an explicit choice, one of {', '.join(PolicyName)} (default: what the selector picks)"
    )
    launch.add_argument("--ranks", type=positive_int, required=True)
    launch.add_argument(
        "--ep", type=positive_int, default=1, help="DistributedConfig(tp_size=EP, ep_size=EP) per replica"
    )
    launch.add_argument(
        "--dispatch", action="store_true", help="token dispatch: DistributedConfig(fsdp_size=RANKS, ep_size=EP)"
    )
    launch.add_argument(
        "--zero3", action="store_true", help="a ZeRO-3 config is active (implied by Zero3Init, EPMeta)"
    )
    launch.add_argument(
        "--gather-and-copy",
        action="store_true",
        help="dense ZeRO-3 as stock transformers loads it, or as a DeepSpeed config with hpZ, NVMe parameter offload "
        "or quantized weights makes it load (default: every rank reads its own partitions)",
    )
    launch.add_argument("--device", choices=[d.value for d in Device], default=Device.GPU.value)
    launch.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="bfloat16")
    launch.add_argument("--fused-checkpoint", action="store_true", help="experts stored fused (no merge on load)")
    launch.add_argument(
        "--baseline-gib", type=non_negative_float, default=0.0, help="host RSS of an idle process, added to peaks"
    )
    launch.add_argument("--json", action="store_true")
    launch.set_defaults(handler=_run_launch)

    proj = modes.add_parser("project", help="published MoE models at 4-64 GPU ranks, every policy")
    proj.add_argument("--models", nargs="+", choices=sorted(PUBLISHED), default=list(PUBLISHED))
    proj.add_argument("--ranks", nargs="+", type=positive_int, default=[4, 8, 32, 64])
    proj.add_argument("--no-plot", action="store_true", help="write the table only (the plot needs matplotlib)")
    proj.add_argument("--out", type=Path, default=Path("build/plan"))
    proj.set_defaults(handler=_run_project)
