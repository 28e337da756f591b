"""`loadpolicy` command line."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from loadpolicy import doctor
from loadpolicy.bench import autoep as autoep_command
from loadpolicy.bench import run as bench_command
from loadpolicy.bench import throughput as throughput_command
from loadpolicy.dsconfig import keeps_flat_partitions, read_config, read_zero_stage, zero_stage_of
from loadpolicy.explain import explain
from loadpolicy.harness.launch import ValidationFailedError, positive_int
from loadpolicy.plan import command as plan_command
from loadpolicy.policy import LoadInputs, LoadPolicyError, ParallelSizes, parse_policy_name
from loadpolicy.sizes import RawSizes, normalise_sizes
from loadpolicy.upstream import commands as upstream_commands
from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.validate import command as validate_command
from loadpolicy.validate import mutants as mutants_command


# Built-in launches for trying the tool without writing a config: name -> (DeepSpeed config, DistributedConfig sizes).
EXAMPLES: dict[str, tuple[dict[str, object] | None, RawSizes]] = {
    "ep-zero3": ({"zero_optimization": {"stage": 3}}, RawSizes(tp_size=2, ep_size=2)),
    "dense-zero3": ({"zero_optimization": {"stage": 3}}, RawSizes()),
    "plain-ep": (None, RawSizes(tp_size=2, ep_size=2)),
    "ep-zero3-dispatch": ({"zero_optimization": {"stage": 3}}, RawSizes(fsdp_size=2, ep_size=2)),
    "zero3-fsdp": ({"zero_optimization": {"stage": 3}}, RawSizes(fsdp_size=2)),
}


def _add_explain(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="print the load policy a launch will get, and why",
        description="Print the load policy `from_pretrained` will select for a launch, with each decision and why.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--deepspeed-config", type=Path, metavar="JSON", help="DeepSpeed config file (default: none)")
    source.add_argument("--example", choices=sorted(EXAMPLES), help="explain a built-in example launch")
    sizes = parser.add_argument_group("DistributedConfig sizes (as passed to from_pretrained)")
    for flag in ("--tp-size", "--ep-size", "--fsdp-size", "--pp-size", "--dp-replicate-size"):
        sizes.add_argument(flag, type=positive_int, metavar="N")
    sizes.add_argument("--enable-expert-parallel", action="store_true", help="the deprecated DistributedConfig flag")
    sizes.add_argument(
        "--world-size", type=positive_int, default=1, metavar="N", help="for tp_size derived by tp_plan"
    )
    sizes.add_argument("--tp-plan", action="store_true", help="a tp_plan is given (tp_size derived from world size)")
    parser.add_argument("--quantized", action="store_true", help="the model is quantized (a quantization_config)")
    parser.add_argument(
        "--outer-zero3-init", action="store_true", help="from_pretrained runs inside a deepspeed.zero.Init"
    )
    parser.add_argument("--policy", metavar="NAME", help="an explicit choice: Zero3Init, MetaShardOnRead or EPMeta")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_run_explain)


def _run_explain(args: argparse.Namespace) -> str:
    if args.example is not None:
        ds_config, raw = EXAMPLES[args.example]
        stage = 0 if ds_config is None else zero_stage_of(ds_config, source=f"example {args.example!r}")
    else:
        ds_config = None if args.deepspeed_config is None else read_config(args.deepspeed_config)
        source = f"DeepSpeed config {str(args.deepspeed_config)!r}"
        stage = 0 if ds_config is None else zero_stage_of(ds_config, source=source)
        raw = RawSizes(
            tp_size=args.tp_size,
            ep_size=args.ep_size,
            fsdp_size=args.fsdp_size,
            pp_size=args.pp_size,
            dp_replicate_size=args.dp_replicate_size,
            enable_expert_parallel=args.enable_expert_parallel,
            tp_plan_given=args.tp_plan,
        )
    normalised = normalise_sizes(raw, world_size=args.world_size)
    inputs = LoadInputs(
        zero3_enabled=stage == 3,
        quantized=args.quantized,
        outer_zero3_init=args.outer_zero3_init,
        zero3_flat_partitions=ds_config is not None and keeps_flat_partitions(ds_config),
        sizes=normalised.sizes,
        requested=None if args.policy is None else parse_policy_name(args.policy),
    )
    explanation = explain(inputs, warnings=normalised.warnings)
    return explanation.to_json() if args.json else explanation.to_text()


def _add_doctor(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check a DeepSpeed config for known ZeRO-3 failures", description=doctor.__doc__
    )
    parser.add_argument("--deepspeed-config", type=Path, required=True, metavar="JSON")
    parser.add_argument("--deepspeed-version", help="the DeepSpeed that will run it (default: the installed one)")
    for flag in ("--tp-size", "--ep-size", "--fsdp-size"):
        parser.add_argument(flag, type=int, default=1, help="the launch's DistributedConfig size (default 1)")
    parser.set_defaults(handler=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> str:
    stage = read_zero_stage(args.deepspeed_config)
    config = json.loads(args.deepspeed_config.read_text(encoding="utf-8"))
    version = args.deepspeed_version
    if version is None:
        try:
            version = importlib.metadata.version("deepspeed")
        except importlib.metadata.PackageNotFoundError:
            version = None
    sizes = ParallelSizes(tp=args.tp_size, ep=args.ep_size, fsdp=args.fsdp_size)
    findings = doctor.check_deepspeed_config(config, version, sizes)
    lines = [f"ZeRO stage {stage}, DeepSpeed {version or '(not installed)'}"]
    lines += [f"{f.severity}: [{f.check}] {f.message}" for f in findings]
    if any(f.severity is doctor.Severity.ERROR for f in findings):
        raise LoadPolicyError("\n".join(lines))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loadpolicy", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_explain(subparsers)
    _add_doctor(subparsers)
    upstream_commands.add_parsers(subparsers)
    validate_command.add_parser(subparsers)
    bench_command.add_parser(subparsers)
    autoep_command.add_parser(subparsers)
    throughput_command.add_parser(subparsers)
    mutants_command.add_parser(subparsers)
    plan_command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        output = args.handler(args)
    except (
        LoadPolicyError,
        UpstreamError,
        ValidationFailedError,
        bench_command.BenchFailedError,
        plan_command.CalibrationMissError,
        mutants_command.MutationError,
    ) as exc:
        print(f"loadpolicy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    print(output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
