"""`loadpolicy mutants`: break one behaviour at a time and show which check catches it.

Each mutation replaces one exact piece of text, in a copy of the patched tree's `src` or of our `loadpolicy` package,
and runs the smallest part of the validation that must fail because of it (a matrix launch, a parity case, a bad-input
case, or the unit tests). Every check first runs on the unmutated code, where it must pass; a mutation whose text is no
longer found, a check that fails unmutated, or a mutation nobody catches fails the command.
"""

from __future__ import annotations

import argparse
import enum
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import loadpolicy
from loadpolicy.errors import CommandError
from loadpolicy.faults.run import FAULT_CASES, build_fault_checkpoints, run_fault
from loadpolicy.harness.launch import Launcher, Tree, add_launch_arguments
from loadpolicy.matrix.runner import launch, prepare_matrix
from loadpolicy.matrix.scenarios import Run, Scenario
from loadpolicy.parity.run import ParityCase, Trainer, run_parity


OUR_PACKAGE = Path(loadpolicy.__file__).resolve().parent


class Target(enum.StrEnum):
    TREE = "patched tree"  # paths relative to src/transformers of the patched checkout
    POLICY = "loadpolicy"  # paths relative to our package


@dataclass(frozen=True, slots=True)
class Setup:
    trees: dict[Tree, Path]
    checkpoints: Path
    variants: dict[str, Path]
    tests: Path
    timeout: float


@dataclass(frozen=True, slots=True)
class Check:
    """The smallest part of the validation that must fail when its behaviour breaks."""

    label: str
    run: Run | None = None
    parity: ParityCase | None = None
    fault: str | None = None  # a FAULT_CASES name, at 2 ranks
    unit_tests: tuple[str, ...] = ()  # test files under Setup.tests
    in_tree: str | None = None  # a `-k` selection of the patched tree's own DeepSpeed tests (`RUN_SLOW=1`)

    def passes(self, code: Path, setup: Setup, out: Path) -> tuple[bool, str]:
        """Run this check with `code` as the patched tree (or as our package's parent, for unit tests)."""
        trees = {Tree.STOCK: setup.trees[Tree.STOCK], Tree.PATCHED: code}
        if self.run is not None:
            outcome = launch(self.run, trees, setup.checkpoints, out, setup.timeout)
            details = [a.detail for a in outcome.archs if not a.passed]
            return outcome.met_expectation, outcome.launch_error or "; ".join(details)[:300]
        if self.parity is not None:
            parity = run_parity(self.parity, trees, setup.checkpoints, out, setup.timeout)
            return parity.passed, parity.detail[:300]
        if self.fault is not None:
            case = next(c for c in FAULT_CASES if c.name == self.fault)
            fault = run_fault(case, 2, code, setup.variants, out)
            return fault.passed, fault.detail[:300]
        if self.in_tree is not None:  # the tree's tests, run on `code`: its `src` goes first on the path
            checkout = setup.trees[Tree.PATCHED]
            options = ["-c", str(checkout / "pyproject.toml"), "--rootdir", str(checkout), "-k", self.in_tree]
            tests = [checkout / "tests" / "deepspeed" / f"test_deepspeed_{name}.py" for name in IN_TREE_FILES]
            return _pytest_passes(code / "src", tests, out, setup.timeout, options, {"RUN_SLOW": "1"})
        return _pytest_passes(code, [setup.tests / name for name in self.unit_tests], out, setup.timeout)


def _pytest_passes(
    code: Path,
    tests: list[Path],
    out: Path,
    timeout: float,
    options: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[bool, str]:
    out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        *(options or []),
        *map(str, tests),
    ]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f}s"
    (out / "pytest.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    lines = (done.stdout + done.stderr).strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return done.returncode == 0, (failed or lines[-1:] or ["no output"])[0][:300]


@dataclass(frozen=True, slots=True)
class Mutation:
    name: str
    breaks: str  # the behaviour, in words
    target: Target
    path: str
    old: str
    new: str
    check: Check


UNITS = Check("unit tests: variants, selection table", unit_tests=("test_variants.py", "test_selection_table.py"))
EP_LOAD = Check("matrix: EP under ZeRO-3, torchrun x2", run=Run(Scenario.EP_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2))
COMPOSITE_EP_LOAD = Check(
    "matrix: composite EP under ZeRO-3, torchrun x2",
    run=Run(Scenario.COMPOSITE_EP_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2),
)
QUANTIZED = Check(
    "matrix: quantized ZeRO-3, torchrun x2", run=Run(Scenario.QUANTIZED_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
)
SGD = Check(
    "parity: qwen3_moe, DeepSpeed SGD x2",
    parity=ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd"),
)
DISPATCH = Check(
    "parity: qwen3_moe, DeepSpeed SGD x2, token dispatch",
    parity=ParityCase("qwen3_moe", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", dispatch=True),
)
MOE_ZERO3 = Check(
    "matrix: MoE ZeRO-3 (conversions), torchrun x2", run=Run(Scenario.MOE_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
)
DENSE_ZERO3 = Check(
    "matrix: dense ZeRO-3, torchrun x2", run=Run(Scenario.DENSE_ZERO3, Tree.PATCHED, Launcher.TORCHRUN, 2)
)
EXPORT = Check(
    "parity: mixtral, DeepSpeed SGD x2, save -> reload on stock",
    parity=ParityCase("mixtral", 2, Trainer.DEEPSPEED, clip=0.0, optimizer="sgd", export=True),
)


# conversion_mapping.py's mixtral entry: the gate (w1) and up (w3) projections merged into gate_up_proj, in this order
MIXTRAL_GATE_UP = """"mixtral": [
            WeightRenaming(".block_sparse_moe.", ".mlp."),
            WeightConverter(
                source_patterns=[
                    ".experts.*.{first}.weight",
                    ".experts.*.{second}.weight","""


# the patched tree's test files `_in_tree` selects from (`-k`)
IN_TREE_FILES = ("expert_parallel", "partition_reads")


def _in_tree(test: str) -> Check:
    return Check(f"in-tree: {test}, torchrun x2", in_tree=test)


def _fault(name: str) -> Check:
    return Check(f"bad input: {name}, x2", fault=name)


MUTATIONS = (
    Mutation(
        "transpose-checks-global-shape",
        "a sharded parameter's local shape decides a checkpoint transpose (qwen3_vl_moe's experts)",
        Target.TREE,
        "core_model_loading.py",
        "expected_shape = param._local_tensor.shape if is_dtensor(param) else param.shape",
        "expected_shape = param.shape",
        COMPOSITE_EP_LOAD,
    ),
    Mutation(
        "ep-plan-shards-dense-mlp",
        "EPMeta leaves the dense modules an EP plan shards to ZeRO-3 (gemma4's mlp)",
        Target.TREE,
        "distributed/mixin.py",
        'if v in ("grouped_gemm", "ep_dispatch_experts")',
        "",
        EP_LOAD,
    ),
    Mutation(
        "epmeta-refuses-device-map",
        "EPMeta admits the mesh-bound device_map",
        Target.POLICY,
        "policy.py",
        "device_map: ClassVar[DeviceMapRule] = DeviceMapRule.ADMIT_MESH_BOUND",
        "device_map: ClassVar[DeviceMapRule] = DeviceMapRule.REFUSE",
        UNITS,
    ),
    Mutation(
        "zero3init-plain-weight-init",
        "Zero3Init initialises missing weights gathered",
        Target.POLICY,
        "policy.py",
        "weight_init: ClassVar[WeightInit] = WeightInit.GATHERED",
        "weight_init: ClassVar[WeightInit] = WeightInit.PLAIN",
        UNITS,
    ),
    Mutation(
        "quantized-build-unmarked",
        "MetaShardOnRead marks a quantized build under ZeRO-3",
        Target.POLICY,
        "policy.py",
        "return InitContext.META_QUANTIZED if self.zero3_enabled and self.quantized else InitContext.META",
        "return InitContext.META",
        UNITS,
    ),
    Mutation(
        "epmeta-nested-zero3-init",
        "EPMeta's sub-models are built on meta, not under a nested zero.Init",
        Target.POLICY,
        "policy.py",
        "nested_from_config_opens_zero3_init: ClassVar[bool] = False  # a nested zero.Init",
        "nested_from_config_opens_zero3_init: ClassVar[bool] = True  # a nested zero.Init",
        UNITS,
    ),
    Mutation(
        "composite-sub-model-zero3-init",
        "a composite model's sub-models stay on their EPMeta parent's meta device, under no nested zero.Init",
        Target.TREE,
        "modeling_utils.py",
        'needs_zero3_init = needs_zero3_init and torch.empty(0).device.type != "meta"',
        "needs_zero3_init = needs_zero3_init",
        COMPOSITE_EP_LOAD,
    ),
    Mutation(
        "zero3-fsdp-admitted",
        "ZeRO-3 with FSDP2 is refused",
        Target.POLICY,
        "policy.py",
        "if (sizes.fsdp > 1 and not token_dispatch) or (sizes.dp_replicate > 1 and not sizes.expert_parallel):",
        "if False:",
        UNITS,
    ),
    Mutation(
        "gate-2-reverted",
        "EP under ZeRO-3 keeps its mesh-bound device_map (gate 2 of the loading map)",
        Target.TREE,
        "integrations/accelerate.py",
        'if set(device_map) != {""}:',
        "if True:",
        EP_LOAD,
    ),
    Mutation(
        "shared-conversion-bug",
        "mixtral's w1/w3 merge order (a bug the patched tree's one-process load would share)",
        Target.TREE,
        "conversion_mapping.py",
        MIXTRAL_GATE_UP.format(first="w1", second="w3"),
        MIXTRAL_GATE_UP.format(first="w3", second="w1"),
        EP_LOAD,
    ),
    Mutation(
        "quantizer-map-refused",
        "ZeRO-3 refuses only the device_map passed in, not the quantizer's",
        Target.TREE,
        "modeling_utils.py",
        "check_device_map_for_load_policy(requested_device_map, load_policy)",
        "check_device_map_for_load_policy(device_map, load_policy)",
        QUANTIZED,
    ),
    Mutation(
        "expert-placement-untagged",
        "expert shards join DeepSpeed's expert groups (placement family)",
        Target.TREE,
        "integrations/deepspeed.py",
        "        moe_utils.place_expert_parameters([param], ep_size)\n        return",
        "        return",
        SGD,
    ),
    Mutation(
        "expert-gradient-unscaled",
        "expert gradients scaled back by tp_size (the ranks of a TP group share a batch)",
        Target.TREE,
        "integrations/deepspeed.py",
        'grad * gradient_scale if hasattr(param, "ds_id") else grad)',
        "grad)",
        SGD,
    ),
    Mutation(
        "token-dispatch-refused",
        "ZeRO-3 owns the fsdp ranks of token dispatch (DistributedConfig(fsdp_size=W, ep_size=E))",
        Target.TREE,
        "integrations/load_policy.py",
        "token_dispatch = sizes.expert_parallel and sizes.tp == 1 and sizes.dp_replicate == 1",
        "token_dispatch = False",
        DISPATCH,
    ),
    Mutation(
        "expert-gradient-scaled-by-ep",
        "no expert gradient scale where every rank has its own batch (the scale is tp_size, not ep_size)",
        Target.TREE,
        "integrations/deepspeed.py",
        "gradient_scale = model._tp_size",
        "gradient_scale = ep_size",
        DISPATCH,
    ),
    Mutation(
        "experts-partitioned-over-ep-group",
        "DeepSpeed partitions an expert shard over the ranks that hold the same experts (efsdp), not its EP group",
        Target.TREE,
        "integrations/deepspeed.py",
        "return group_name, groups._get_expert_data_parallel_group(group_name)",
        "return group_name, groups._get_expert_parallel_group(group_name)",
        DISPATCH,
    ),
    Mutation(
        "capability-checked-after-reading",
        "DeepSpeed's expert placement is checked before any weight is read (the EP PR's hand-over)",
        Target.TREE,
        "modeling_utils.py",
        "check_deepspeed_holds_expert_groups()  # before any weight is read",
        "pass",
        _in_tree("test_a_deepspeed_without_expert_placement_is_refused_before_any_weight_is_read"),
    ),
    Mutation(
        "expert-gradient-scaled-without-deepspeed",
        "the expert gradient scale applies only to a parameter DeepSpeed took over (the EP PR's hand-over)",
        Target.TREE,
        "integrations/deepspeed.py",
        'grad * gradient_scale if hasattr(param, "ds_id") else grad)',
        "grad * gradient_scale)",
        _in_tree("test_a_model_deepspeed_never_wraps_keeps_unscaled_expert_gradients"),
    ),
    Mutation(
        "save-keeps-shards",
        "save_pretrained gathers the expert shards DeepSpeed holds",
        Target.TREE,
        "integrations/deepspeed.py",
        "return load_policy is not None and load_policy.after_loading is AfterLoading.DEEPSPEED_EXPERT_GROUPS",
        "return False",
        EXPORT,
    ),
    Mutation(
        "agreement-off",
        "ranks agree on the load inputs before the first collective",
        Target.TREE,
        "integrations/deepspeed.py",
        "    if (exchange := _load_policy_store()) is None:\n        return\n    store, rank, world_size = exchange",
        "    return\n    store, rank, world_size = _load_policy_store()",
        _fault("plain load, ZeRO-3 config on rank 0 only, process group up"),
    ),
    Mutation(
        "errors-stay-on-their-rank",
        "a loading error on one rank stops every rank with its message",
        Target.TREE,
        "modeling_utils.py",
        "    @fail_together\n",
        "",
        _fault("truncated safetensors, one rank's view"),
    ),
    Mutation(
        "zero3-reads-partitions-off",
        "dense ZeRO-3 with flat partitions reads each rank's partitions",
        Target.POLICY,
        "policy.py",
        "return Zero3Init(reads_partitions=True), reason",
        "return Zero3Init(), reason",
        UNITS,
    ),
    Mutation(
        "partition-reads-fall-back",
        "the patched tree loads dense ZeRO-3 by partition reads, not silently by gather-and-copy",
        Target.TREE,
        "integrations/load_policy.py",
        "return Zero3Init(reads_partitions=True), reason",
        "return Zero3Init(), reason",
        DENSE_ZERO3,
    ),
    Mutation(
        "partition-read-neighbour-range",
        "each rank reads its own flat range of every parameter (DeepSpeed's partition layout)",
        Target.TREE,
        "integrations/deepspeed_partition_reads.py",
        "start = group_rank * partition_numel",
        "start = (group_rank + 1) % group_size * partition_numel",
        MOE_ZERO3,
    ),
    Mutation(
        "partition-read-concatenates-on-dim-0",
        "a converter's concatenation is read along its own dimension (gate and up into gate_up_proj on dim 1)",
        Target.TREE,
        "integrations/deepspeed_partition_reads.py",
        "tensors = {op.get_target_pattern(mapping.target_patterns): _Concatenated(parts, op.dim)}",
        "tensors = {op.get_target_pattern(mapping.target_patterns): _Concatenated(parts, 0)}",
        MOE_ZERO3,
    ),
    Mutation(
        "ep-reads-partitions-off",
        "EP under ZeRO-3 with flat partitions reads partitions (issue 18)",
        Target.POLICY,
        "policy.py",
        "default = EPMeta(ep_size=sizes.ep, reads_partitions=inputs.zero3_flat_partitions)",
        "default = EPMeta(ep_size=sizes.ep)",
        UNITS,
    ),
    Mutation(
        "ep-dense-read-whole",
        "the patched tree partitions an EP model before reading, dense weights included (EP partition reads)",
        Target.TREE,
        "integrations/load_policy.py",
        "default = EPMeta(ep_size=sizes.ep, reads_partitions=inputs.zero3_flat_partitions)",
        "default = EPMeta(ep_size=sizes.ep)",
        _in_tree("test_ep_under_zero3_loads_expert_shards_with_single_process_logits"),
    ),
    Mutation(
        "ep-partition-reads-first-experts",
        "each rank reads its own experts' rows of a checkpoint tensor (EP partition reads)",
        Target.TREE,
        "integrations/deepspeed.py",
        "first = torch.distributed.get_rank(expert_parallel_group) * shape[0]",
        "first = 0",
        _in_tree("test_ep_under_zero3_loads_expert_shards_with_single_process_logits"),
    ),
    Mutation(
        "ep-experts-partitioned-over-the-world",
        "an expert shard is partitioned over its expert data-parallel group at load, not the world",
        Target.TREE,
        "integrations/deepspeed.py",
        "                if is_expert:\n                    _join_deepspeed_expert_groups(local,",
        "                if False:\n                    _join_deepspeed_expert_groups(local,",
        _in_tree("test_ep_under_zero3_reads_partitions_experts_over_the_ranks_that_hold_them"),
    ),
    Mutation(
        "partition-reads-built-with-broadcast",
        "a dense model whose partitions are read is built without zero.Init's broadcast (DeepSpeed series)",
        Target.TREE,
        "modeling_utils.py",
        "zero_init = zero3_init_for_partition_reads if reads_partitions else deepspeed.zero.Init",
        "zero_init = deepspeed.zero.Init",
        _in_tree("test_dense_model_reads_partitions_equal_to_the_checkpoint"),
    ),
    Mutation(
        "ep-partition-reads-built-with-broadcast",
        "an EP model is partitioned before reading without zero.Init's broadcast (DeepSpeed series)",
        Target.TREE,
        "integrations/deepspeed.py",
        "            zero3_init_for_partition_reads(\n                module=module,",
        '            __import__("deepspeed").zero.Init(\n                module=module,',
        _in_tree("test_ep_under_zero3_reads_partitions_experts_over_the_ranks_that_hold_them"),
    ),
    Mutation(
        "partition-reads-keep-the-broadcast",
        "a partition-read build asks a DeepSpeed that offers it to skip the broadcast (DeepSpeed series)",
        Target.TREE,
        "integrations/deepspeed.py",
        '        kwargs["sync_module_states"] = False',
        "        pass",
        _in_tree("test_a_model_whose_partitions_are_read_is_built_without_the_broadcast_where_deepspeed_offers_it"),
    ),
    Mutation(
        "missing-expert-unnamed",
        "a checkpoint missing an expert's tensors fails naming them",
        Target.TREE,
        "modeling_utils.py",
        "if not ignore_mismatched_sizes:\n                raise_if_checkpoint_misses_merged_tensors(",
        "if False:\n                raise_if_checkpoint_misses_merged_tensors(",
        _fault("checkpoint missing expert 3's weights"),
    ),
)


@dataclass(frozen=True, slots=True)
class Verdict:
    mutation: str
    check: str
    caught: bool
    detail: str
    seconds: float


def mutated_copy(mutation: Mutation | None, target: Target, setup: Setup, dest: Path) -> Path:
    """A copy of the code `target` names, with `mutation` applied (None: unmutated); returns what `Check` runs on."""
    shutil.rmtree(dest, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    if target is Target.TREE:
        shutil.copytree(setup.trees[Tree.PATCHED] / "src", dest / "src", ignore=skip)
        root = dest / "src" / "transformers"
    else:
        shutil.copytree(OUR_PACKAGE, dest / "loadpolicy", ignore=skip)
        root = dest / "loadpolicy"
    if mutation is not None:
        path = root / mutation.path
        text = path.read_text(encoding="utf-8")
        if (found := text.count(mutation.old)) != 1:
            raise MutationError(f"{mutation.name}: the text to mutate is in {path} {found} times, expected once")
        path.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")
    return dest


class MutationError(CommandError):
    """A mutation no longer applies: the code it targets changed."""


def _baselines(setup: Setup, out: Path, selected: list[Mutation]) -> list[Verdict]:
    """Every check on unmutated code: it must pass there, or catching a mutation proves nothing."""
    verdicts = []
    checks = {m.check.label: (m.check, m.target) for m in selected}
    for index, (label, (check, target)) in enumerate(checks.items()):
        start = time.monotonic()
        code = mutated_copy(None, target, setup, out / "code" / f"baseline{index}")
        passed, detail = check.passes(code, setup, out / "runs" / f"baseline{index}")
        verdicts.append(Verdict("(none)", label, passed, detail, time.monotonic() - start))
        print(f"{'ok ' if passed else '!! '}baseline | {label}: {'passes' if passed else detail}", flush=True)
    return verdicts


def _mutate(mutation: Mutation, setup: Setup, out: Path) -> Verdict:
    start = time.monotonic()
    try:
        code = mutated_copy(mutation, mutation.target, setup, out / "code" / mutation.name)
    except MutationError as error:
        return Verdict(mutation.name, mutation.check.label, False, str(error), 0.0)
    passed, detail = mutation.check.passes(code, setup, out / "runs" / mutation.name)
    shutil.rmtree(code, ignore_errors=True)
    return Verdict(mutation.name, mutation.check.label, not passed, detail, time.monotonic() - start)


def render(baselines: list[Verdict], verdicts: list[Verdict]) -> str:
    lines = [
        "| mutation | breaks | caught by | result | time |",
        "|---|---|---|---|---|",
    ]
    breaks = {m.name: m.breaks for m in MUTATIONS}
    for v in verdicts:
        result = ("caught: " if v.caught else "NOT CAUGHT: ") + v.detail.replace("|", "/").replace("\n", " ")[:160]
        lines.append(f"| `{v.mutation}` | {breaks[v.mutation]} | {v.check} | {result} | {v.seconds:.1f}s |")
    lines += ["", "| check, unmutated | result | time |", "|---|---|---|"]
    lines += [
        f"| {b.check} | {'passes' if b.caught else 'FAILS: ' + b.detail[:160]} | {b.seconds:.1f}s |" for b in baselines
    ]
    return "\n".join(lines)


def mutants(out: Path, patches: Path, cache: Path, tests: Path, timeout: float, only: list[str]) -> int:
    started = time.monotonic()
    trees, checkpoints = prepare_matrix(out, patches, cache, timeout)
    setup = Setup(trees, checkpoints, build_fault_checkpoints(checkpoints), tests.resolve(), timeout)
    selected = [m for m in MUTATIONS if not only or m.name in only]
    unknown = sorted(set(only) - {m.name for m in MUTATIONS})
    if unknown:
        raise MutationError(f"unknown mutations {unknown}; accepted: {[m.name for m in MUTATIONS]}")
    baselines = _baselines(setup, out, selected)
    verdicts = []
    for index, mutation in enumerate(selected, start=1):
        verdict = _mutate(mutation, setup, out)
        verdicts.append(verdict)
        mark = "ok " if verdict.caught else "!! "
        where = f"{mark}[{index}/{len(selected)}] {mutation.name} -> {verdict.check}"
        print(f"{where}: {verdict.detail[:200]} ({verdict.seconds:.1f}s)", flush=True)
    table = render(baselines, verdicts)
    (out / "mutants.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    failed = [b for b in baselines if not b.caught] + [v for v in verdicts if not v.caught]
    print(f"\n{len(verdicts)} mutations, {len(failed)} problems, {time.monotonic() - started:.0f}s")
    print(f"table: {out / 'mutants.md'}", file=sys.stderr)
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("mutants", help="break one behaviour at a time and show which check catches it")
    parser.add_argument("names", nargs="*", help=f"mutations to run (default: all of {[m.name for m in MUTATIONS]})")
    parser.add_argument("--out", type=Path, default=Path("build/mutants"), help="work directory and table")
    add_launch_arguments(parser, timeout=180.0)
    parser.add_argument("--tests", type=Path, default=Path("tests/unit"), help="where the unit tests are")
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> str:
    if mutants(args.out, args.patches, args.cache, args.tests, args.timeout, args.names):
        raise MutationError("a check failed on unmutated code, or a mutation was not caught: see the table above")
    return "every mutation was caught, and every check passes on unmutated code"
