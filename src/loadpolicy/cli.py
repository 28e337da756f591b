"""`loadpolicy` command line."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from loadpolicy import doctor
from loadpolicy.errors import CommandError, positive_int
from loadpolicy.explain import explain
from loadpolicy.launch_inputs import read_launch
from loadpolicy.policy import LoadPolicyError, parse_policy_name
from loadpolicy.sizes import RawSizes, check_world_size


_Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


@dataclass(frozen=True)
class _LazyCommand:
    """A command whose module is imported only when it is the one run: the harness behind `dev` and `plan` must not
    slow `--help` or `explain`, nor need torch where only the standard library is installed."""

    name: str
    help: str
    module: str
    adder: str = "add_parser"

    def add_to(self, subparsers: _Subparsers, chosen: bool) -> None:
        if not chosen:
            subparsers.add_parser(self.name, help=self.help)
            return
        try:
            module = importlib.import_module(self.module)
        except ModuleNotFoundError as exc:
            if exc.name != LAB_PACKAGE:
                raise
            # no option prefix: whatever follows the command (`--runs 3`, `-h`) reaches the handler that names the lab
            parser = subparsers.add_parser(self.name, help=self.help, prefix_chars="\0", add_help=False)
            parser.add_argument("arguments", nargs="*")
            parser.set_defaults(handler=_LabMissing(self.name))
            return
        getattr(module, self.adder)(subparsers)


# The harness behind most `dev` commands: a checkout's editable install carries it, the wheel a user installs does not.
LAB_PACKAGE = "loadpolicy_lab"


@dataclass(frozen=True)
class _LabMissing:
    """The handler of a maintainer's command that this install does not carry: says where it is, runs nothing."""

    name: str

    def __call__(self, args: argparse.Namespace) -> str:
        raise CommandError(
            f"`loadpolicy dev {self.name}` runs the maintainer's harness ({LAB_PACKAGE}), which this install does not "
            "carry: the wheel holds the policy, explain, doctor, plan, checkout and the series tools. From a checkout "
            "of the repository, run `pip install -e '.[dev]'` (or use its tox environments)."
        )


USER_COMMANDS = (
    _LazyCommand(
        "plan", "loading cost model: one launch's figures, published models projected", "loadpolicy.plan.command"
    ),
    _LazyCommand(
        "checkout",
        "pinned transformers sdist, verified, as git with the series",
        "loadpolicy.upstream.commands",
        "add_checkout_parser",
    ),
)
DEV_COMMANDS = (
    _LazyCommand(
        "series", "lint, export or refresh the patch series", "loadpolicy.upstream.commands", "add_series_parser"
    ),
    _LazyCommand(
        "validate",
        "real multi-process loads on stock and patched transformers, with a report",
        "loadpolicy_lab.validate.command",
    ),
    _LazyCommand(
        "mutants",
        "break one behaviour at a time and show which check catches it",
        "loadpolicy_lab.validate.mutants.command",
    ),
    _LazyCommand(
        "perf",
        "the performance suite: loads, reads, saves and a training step, at the bench's sizes and published widths",
        "loadpolicy_lab.perf.command",
    ),
    _LazyCommand(
        "autoep",
        "EP under ZeRO-3: our EPMeta path against DeepSpeed AutoEP (load time, peak RSS, parity)",
        "loadpolicy_lab.autoep.run",
    ),
    _LazyCommand(
        "throughput",
        "training tokens/s per rank: token dispatch vs tp = ep vs DeepSpeed AutoEP vs plain ZeRO-3",
        "loadpolicy_lab.throughput.run",
    ),
    _LazyCommand(
        "gpu", "what only a GPU shows: loads, saves, training and reads on the device", "loadpolicy_lab.gpu.run"
    ),
    _LazyCommand(
        "store-scaling",
        "the store exchanges of a collective load (agreement, load outcome) before and after, at W = 8 to 1,024",
        "loadpolicy.upstream.store_command",
    ),
)

# Built-in launches for trying the tool without writing a config: name -> (DeepSpeed config, DistributedConfig sizes).
EXAMPLES: dict[str, tuple[dict[str, object] | None, RawSizes]] = {
    "ep-zero3": ({"zero_optimization": {"stage": 3}}, RawSizes(tp_size=2, ep_size=2)),
    "dense-zero3": ({"zero_optimization": {"stage": 3}}, RawSizes()),
    "plain-ep": (None, RawSizes(tp_size=2, ep_size=2)),
    "ep-zero3-dispatch": ({"zero_optimization": {"stage": 3}}, RawSizes(fsdp_size=2, ep_size=2)),
    "zero3-fsdp": ({"zero_optimization": {"stage": 3}}, RawSizes(fsdp_size=2)),
}


def _add_explain(subparsers: _Subparsers) -> None:
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
        "--world-size",
        type=positive_int,
        metavar="N",
        help="the launch's ranks: the sizes must span them; derives tp_size with --tp-plan (default: unchecked, 1)",
    )
    sizes.add_argument("--tp-plan", action="store_true", help="a tp_plan is given (tp_size derived from world size)")
    parser.add_argument("--quantized", action="store_true", help="the model is quantized (a quantization_config)")
    parser.add_argument(
        "--outer-zero3-init", action="store_true", help="from_pretrained runs inside a deepspeed.zero.Init"
    )
    parser.add_argument("--policy", metavar="NAME", help="an explicit choice: Zero3Init, MetaShardOnRead or EPMeta")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_run_explain)


def _sizes_given(args: argparse.Namespace) -> list[str]:
    """The size options given on the command line, as the user spelled them."""
    given = [f"--{name.replace('_', '-')}" for name in _SIZE_OPTIONS if getattr(args, name) is not None]
    given += [
        flag
        for flag, on in (("--enable-expert-parallel", args.enable_expert_parallel), ("--tp-plan", args.tp_plan))
        if on
    ]
    return given


_SIZE_OPTIONS = ("tp_size", "ep_size", "fsdp_size", "pp_size", "dp_replicate_size", "world_size")


def _run_explain(args: argparse.Namespace) -> str:
    requested = None if args.policy is None else parse_policy_name(args.policy)
    flags = {"quantized": args.quantized, "outer_zero3_init": args.outer_zero3_init, "requested": requested}
    if args.example is not None:
        ds_config, raw = EXAMPLES[args.example]
        if given := _sizes_given(args):
            raise CommandError(
                f"--example {args.example} fixes the launch (DeepSpeed config {json.dumps(ds_config)}, "
                f"{raw.describe()}) and would ignore {', '.join(given)}; accepted: --example alone, or your own "
                "launch as --deepspeed-config FILE (examples/ds_zero3.json) with the size options."
            )
        launch = read_launch(ds_config, raw, source=f"example {args.example!r}", **flags)
    else:
        raw = RawSizes(
            tp_size=args.tp_size,
            ep_size=args.ep_size,
            fsdp_size=args.fsdp_size,
            pp_size=args.pp_size,
            dp_replicate_size=args.dp_replicate_size,
            enable_expert_parallel=args.enable_expert_parallel,
            tp_plan_given=args.tp_plan,
        )
        launch = read_launch(args.deepspeed_config, raw, world_size=args.world_size or 1, **flags)
        if args.world_size is not None:
            check_world_size(launch.inputs.sizes, args.world_size)
    explanation = explain(launch.inputs, warnings=launch.warnings)
    return explanation.to_json() if args.json else explanation.to_text()


def _add_doctor(subparsers: _Subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check a DeepSpeed config for known ZeRO-3 failures", description=doctor.__doc__
    )
    parser.add_argument("--deepspeed-config", type=Path, required=True, metavar="JSON")
    parser.add_argument("--deepspeed-version", help="the DeepSpeed that will run it (default: the installed one)")
    for flag in ("--tp-size", "--ep-size", "--fsdp-size"):
        parser.add_argument(
            flag, type=positive_int, metavar="N", help="the launch's DistributedConfig size (default: unset)"
        )
    parser.set_defaults(handler=_run_doctor)


def _run_doctor(args: argparse.Namespace) -> str:
    raw = RawSizes(tp_size=args.tp_size, ep_size=args.ep_size, fsdp_size=args.fsdp_size)
    launch = read_launch(args.deepspeed_config, raw)
    assert launch.config is not None  # --deepspeed-config is required
    version = args.deepspeed_version
    if version is None:
        try:
            version = importlib.metadata.version("deepspeed")
        except importlib.metadata.PackageNotFoundError:
            version = None
    findings = doctor.check_deepspeed_config(launch.config, version, launch.inputs.sizes)
    lines = [f"ZeRO stage {launch.stage}, DeepSpeed {version or '(not installed)'}"]
    lines += [f"{f.severity}: [{f.check}] {f.message}" for f in findings]
    lines += [f"warning: {warning}" for warning in launch.warnings]
    if any(f.severity is doctor.Severity.ERROR for f in findings):
        raise LoadPolicyError("\n".join(lines))
    return "\n".join(lines)


def _version() -> str:
    try:
        return f"loadpolicy {importlib.metadata.version('loadpolicy')}"
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "loadpolicy (not installed)"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`: only the command it names imports its module (every command's, when `argv` is None)."""
    command = argv[0] if argv and not argv[0].startswith("-") else None
    dev_command = argv[1] if argv and command == "dev" and len(argv) > 1 else None
    parser = argparse.ArgumentParser(prog="loadpolicy", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_explain(subparsers)
    _add_doctor(subparsers)
    for user in USER_COMMANDS:
        user.add_to(subparsers, chosen=argv is None or command == user.name)
    dev = subparsers.add_parser(
        "dev",
        help="the maintainer's commands: the patch series, validation, benchmarks, mutation checks",
        description="The maintainer's commands (docs/README.md says which doc covers each).",
    ).add_subparsers(dest="dev_command", required=True, metavar="COMMAND")
    for lazy in DEV_COMMANDS:
        lazy.add_to(dev, chosen=argv is None or dev_command == lazy.name)
    return parser


def _command_words(args: argparse.Namespace) -> str:
    """The command as typed, for error messages: `loadpolicy dev series lint`, `loadpolicy plan launch`."""
    words = [args.command]
    words += [w for w in (getattr(args, k, None) for k in ("dev_command", "series_command", "perf_kind", "mode")) if w]
    return " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(words).parse_args(words)
    try:
        output = args.handler(args)
        print(output)
        sys.stdout.flush()
    except (LoadPolicyError, CommandError) as exc:
        print(f"loadpolicy {_command_words(args)}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `loadpolicy explain ... | head`: the reader left; say nothing, and keep Python from reporting it at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
