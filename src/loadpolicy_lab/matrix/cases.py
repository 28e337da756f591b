"""The validation matrix: which loads run, on which launcher and tree, and what each is expected to do."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from loadpolicy.policy import PolicyName
from loadpolicy.shape import EPLayout, LaunchShape
from loadpolicy_lab.harness.launch import STOCK_DEVICE_MAP_ERROR, Launcher, Tree
from loadpolicy_lab.models.architectures import ARCHITECTURES


class Scenario(enum.StrEnum):
    PLAIN_EP = "plain EP"
    DENSE_ZERO3 = "dense ZeRO-3"
    MOE_ZERO3 = "MoE ZeRO-3 (conversions)"
    EP_ZERO3 = "EP under ZeRO-3"
    EP_ZERO3_DISPATCH = "EP under ZeRO-3, token dispatch"
    COMPOSITE_EP_ZERO3 = "composite EP under ZeRO-3"
    REFUSED_ZERO3_FSDP = "refused: ZeRO-3 + FSDP2"
    QUANTIZED_ZERO3 = "quantized ZeRO-3 (bnb 8-bit)"


COMPOSITE = ("glm4v_moe",)
# composite, and plain EP fails on stock for it (fixed by the sharded-transpose PR): only where stock fails for
# every architecture
STOCK_EP_BROKEN = ("qwen3_vl_moe",)
MOE = tuple(name for name, arch in ARCHITECTURES.items() if arch.moe and name not in COMPOSITE + STOCK_EP_BROKEN)
DENSE = ("llama",)


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    archs: tuple[str, ...]
    zero3: bool
    # how the launch spells EP in its DistributedConfig (the sizes follow from the world size)
    layout: EPLayout
    # policy each rank must report on the patched tree (None: the load must be refused); written out here, not asked
    # of the selector, so that the matrix checks the selector rather than repeating it
    patched_policy: PolicyName | None
    # the error every rank must raise on stock 5.23.0 (the bug), or None when stock must pass (behaviour we keep)
    stock_error: str | None
    # substring every rank's error must contain on the patched tree, for refused combinations
    refusal: str | None = None
    # bitsandbytes 8-bit on load (its quantizer fills in device_map={"": "cpu"} when none is passed), or None
    bnb_8bit: bool = False

    @property
    def stock_fails(self) -> bool:
        return self.stock_error is not None


def _ep_under_zero3(archs: tuple[str, ...], layout: EPLayout = EPLayout.TP_EQUALS_EP) -> ScenarioSpec:
    """The bug: EPMeta on the patched tree, the ZeRO-3 `device_map` refusal on stock."""
    return ScenarioSpec(
        archs,
        zero3=True,
        layout=layout,
        patched_policy=PolicyName.EP_META,
        stock_error=STOCK_DEVICE_MAP_ERROR,
    )


SCENARIOS: dict[Scenario, ScenarioSpec] = {
    Scenario.PLAIN_EP: ScenarioSpec(
        MOE + COMPOSITE,
        zero3=False,
        layout=EPLayout.TP_EQUALS_EP,
        patched_policy=PolicyName.META_SHARD_ON_READ,
        stock_error=None,
    ),
    Scenario.DENSE_ZERO3: ScenarioSpec(
        DENSE, zero3=True, layout=EPLayout.NONE, patched_policy=PolicyName.ZERO3_INIT, stock_error=None
    ),
    Scenario.MOE_ZERO3: ScenarioSpec(
        MOE, zero3=True, layout=EPLayout.NONE, patched_policy=PolicyName.ZERO3_INIT, stock_error=None
    ),
    Scenario.EP_ZERO3: _ep_under_zero3(MOE),
    # DistributedConfig(fsdp_size=world, ep_size=world): every rank its own batch, tokens dispatched by all-to-all
    Scenario.EP_ZERO3_DISPATCH: _ep_under_zero3(MOE, EPLayout.TOKEN_DISPATCH),
    Scenario.COMPOSITE_EP_ZERO3: _ep_under_zero3(COMPOSITE + STOCK_EP_BROKEN),
    Scenario.REFUSED_ZERO3_FSDP: ScenarioSpec(
        ("qwen3_moe",),
        zero3=True,
        layout=EPLayout.FSDP_WITHOUT_EP,
        patched_policy=None,
        stock_error=STOCK_DEVICE_MAP_ERROR,
        refusal="cannot be combined with FSDP2 data parallelism (fsdp_size=",
    ),
    # QLoRA under ZeRO-3: stock loads it (the ZeRO-3 device_map refusal runs before the quantizer fills one in)
    Scenario.QUANTIZED_ZERO3: ScenarioSpec(
        (*DENSE, "qwen3_moe"),
        zero3=True,
        layout=EPLayout.NONE,
        patched_policy=PolicyName.META_SHARD_ON_READ,
        stock_error=None,
        bnb_8bit=True,
    ),
}


@dataclass(frozen=True, slots=True)
class Run:
    """One launch: a scenario on one tree, launcher and world size, loading every architecture of the scenario."""

    scenario: Scenario
    tree: Tree
    launcher: Launcher
    ranks: int
    # the architectures to load instead of the scenario's own (`validate --architectures all`)
    archs: tuple[str, ...] | None = None

    @property
    def spec(self) -> ScenarioSpec:
        spec = SCENARIOS[self.scenario]
        return spec if self.archs is None else dataclasses.replace(spec, archs=self.archs)

    @property
    def shape(self) -> LaunchShape:
        return LaunchShape(self.ranks, self.spec.zero3, self.spec.layout, quantized=self.spec.bnb_8bit)

    @property
    def label(self) -> str:
        return f"{self.scenario} | {self.launcher} x{self.ranks} | {self.tree}"


EP_UNDER_ZERO3 = (Scenario.EP_ZERO3, Scenario.COMPOSITE_EP_ZERO3)
# Where the world size changes what each rank owns and reads: experts over EP ranks, partitions read through the
# checkpoint's conversions. The main job runs these at 4 ranks; the others' loads at 4 only in the sweep.
WIDTH_DEPENDENT = (*EP_UNDER_ZERO3, Scenario.EP_ZERO3_DISPATCH, Scenario.MOE_ZERO3)
# What `accelerate launch` changes (its DeepSpeed plugin and process setup) before a ZeRO-3 load: the main job runs it
# for EP under ZeRO-3 (at 4 ranks too), token dispatch and the dense case; the sweep for every ZeRO-3 scenario
THROUGH_ACCELERATE = (*EP_UNDER_ZERO3, Scenario.EP_ZERO3_DISPATCH, Scenario.DENSE_ZERO3)


def full_matrix(*, sweep: bool = False) -> list[Run]:
    """The sweep: torchrun at 2 and 4 ranks everywhere, on both trees; accelerate launch for every ZeRO-3 scenario,
    at 4 ranks too for EP under ZeRO-3.

    Without `sweep` (the main job), each behaviour once where it can differ:
    - the stock tree at 2 ranks through torchrun, for EP under ZeRO-3 (the bug: every scenario stock must fail stops
      at the same `device_map` gate, before any collective, whatever the launcher and width) and for dense ZeRO-3
      (what it must keep doing); every patched run is judged against the stock tree's one-process load of its
      checkpoint, not against a stock launch;
    - the patched tree at 2 ranks everywhere, at 4 where the width changes what a rank reads (`WIDTH_DEPENDENT`),
      and through accelerate launch for `THROUGH_ACCELERATE` (EP under ZeRO-3 at 4 ranks too)."""
    runs: list[Run] = []
    for scenario, spec in SCENARIOS.items():
        for tree in Tree:
            runs.extend(Run(scenario, tree, Launcher.TORCHRUN, ranks) for ranks in (2, 4))
            if spec.zero3:
                accelerate_ranks = (2, 4) if scenario in EP_UNDER_ZERO3 else (2,)
                runs.extend(Run(scenario, tree, Launcher.ACCELERATE, ranks) for ranks in accelerate_ranks)
    if sweep:
        return runs
    return [run for run in runs if _in_main_job(run)]


def _in_main_job(run: Run) -> bool:
    if run.tree is Tree.STOCK:
        shown = run.scenario in (Scenario.EP_ZERO3, Scenario.DENSE_ZERO3)
        return shown and run.launcher is Launcher.TORCHRUN and run.ranks == 2
    if run.launcher is Launcher.ACCELERATE:
        return run.scenario in THROUGH_ACCELERATE and (run.ranks == 2 or run.scenario is Scenario.EP_ZERO3)
    return run.ranks == 2 or run.scenario in WIDTH_DEPENDENT


def fast_matrix() -> list[Run]:
    """Every scenario once at 2 ranks on both trees, EP under ZeRO-3 also through accelerate launch."""
    runs = [Run(scenario, tree, Launcher.TORCHRUN, 2) for scenario in SCENARIOS for tree in Tree]
    runs += [Run(Scenario.EP_ZERO3, tree, Launcher.ACCELERATE, 2) for tree in Tree]
    return runs
