"""Normalise raw distributed sizes the way transformers 5.23.0's `DistributedConfig` does, without importing it.

`loadpolicy explain` runs before any launch and on machines without torch, so it cannot build a `DistributedConfig`.
This mirrors `DistributedConfig._resolve_parallelism` and `_validate_mesh_config`
(`distributed/configuration_utils.py:132-191` in 5.23.0); `tests/unit/test_sizes.py` pins the behaviour, and the
live adapter (`loadpolicy.live`) uses transformers' own normalisation instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loadpolicy.policy import LoadPolicyError, ParallelSizes


@dataclass(frozen=True, slots=True)
class RawSizes:
    """Sizes as a user writes them in `DistributedConfig(...)`; `None` means "not given"."""

    tp_size: int | None = None
    ep_size: int | None = None
    fsdp_size: int | None = None
    pp_size: int | None = None
    dp_replicate_size: int | None = None
    enable_expert_parallel: bool = False
    tp_plan_given: bool = False

    def describe(self) -> str:
        """The sizes given, as `DistributedConfig(...)` keyword arguments."""
        given = [
            f"{name}={getattr(self, name)}"
            for name in ("tp_size", "ep_size", "fsdp_size", "pp_size", "dp_replicate_size")
            if getattr(self, name) is not None
        ]
        if self.enable_expert_parallel:
            given.append("enable_expert_parallel=True")
        return ", ".join(given) or "no sizes"


@dataclass(frozen=True, slots=True)
class NormalisedSizes:
    sizes: ParallelSizes
    warnings: tuple[str, ...] = field(default=())


def _derive_tp(raw: RawSizes, others: int, world_size: int) -> int:
    if raw.tp_size is not None:
        return raw.tp_size
    if not raw.tp_plan_given:
        return 1
    if world_size % others:
        raise LoadPolicyError(
            f"WORLD_SIZE ({world_size}) must be divisible by dp_replicate_size * fsdp_size * pp_size ({others}) "
            "to derive tp_size."
        )
    return world_size // others


def _derive_ep(raw: RawSizes, tp: int, warnings: list[str]) -> int:
    if not raw.enable_expert_parallel:
        return 1 if raw.ep_size is None else raw.ep_size
    if raw.ep_size is not None:
        if raw.ep_size == 1:
            warnings.append("enable_expert_parallel=True with ep_size=1 leaves expert parallelism OFF.")
        return raw.ep_size
    # transformers maps the deprecated flag to ep_size = tp_size; with tp_size=1 that silently leaves EP off.
    if tp == 1:
        warnings.append(
            "enable_expert_parallel=True without ep_size normalises to ep_size=tp_size=1: expert parallelism is "
            "OFF. Write DistributedConfig(tp_size=N, ep_size=N) (N = ranks) to shard experts."
        )
    else:
        warnings.append(
            f"enable_expert_parallel=True without ep_size is deprecated; it means ep_size={tp}. "
            f"Write DistributedConfig(tp_size={tp}, ep_size={tp})."
        )
    return tp


def normalise_sizes(raw: RawSizes, world_size: int = 1) -> NormalisedSizes:
    """Return the sizes transformers would use, with warnings for spellings that do not do what they seem to."""
    for name in ("tp_size", "ep_size", "fsdp_size", "pp_size", "dp_replicate_size"):
        value = getattr(raw, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise LoadPolicyError(f"`{name}` must be an integer >= 1 or unset, got {value!r}.")
    fsdp = raw.fsdp_size or 1
    dp_replicate = raw.dp_replicate_size or 1
    pp = raw.pp_size or 1
    tp = _derive_tp(raw, dp_replicate * fsdp * pp, world_size)
    warnings: list[str] = []
    ep = _derive_ep(raw, tp, warnings)

    if ep > 1:
        if ep % tp:
            raise LoadPolicyError(f"`ep_size` ({ep}) must be a multiple of `tp_size` ({tp}).")
        if (fsdp * tp) % ep:
            # transformers' message as the series words it: `ep_size` alone is the first thing users write
            raise LoadPolicyError(
                f"`ep_size` ({ep}) must divide `fsdp_size * tp_size` ({fsdp} * {tp}). For every rank on its own "
                "batch, tokens sent to their experts by all-to-all, write `DistributedConfig(fsdp_size=<world size>, "
                f"ep_size={ep})`; for the {ep} ranks to share a batch, "
                f"`DistributedConfig(tp_size={ep}, ep_size={ep})`."
            )
    if dp_replicate * fsdp > 1 and pp > 1:
        raise LoadPolicyError(
            f"FSDP (fsdp_size={fsdp}, dp_replicate_size={dp_replicate}) cannot be combined with pipeline "
            f"parallelism (pp_size={pp}) in transformers 5.23.0."
        )
    sizes = ParallelSizes(tp=tp, ep=ep, fsdp=fsdp, pp=pp, dp_replicate=dp_replicate)
    return NormalisedSizes(sizes=sizes, warnings=tuple(warnings))


def check_world_size(sizes: ParallelSizes, world_size: int) -> None:
    """Refuse sizes whose device mesh does not hold the launch's ranks: transformers builds one mesh of
    pp_size x dp_replicate_size x fsdp_size x tp_size and needs exactly that many processes."""
    mesh = sizes.pp * sizes.dp_replicate * sizes.fsdp * sizes.tp
    if mesh > 1 and mesh != world_size:
        raise LoadPolicyError(
            f"DistributedConfig({sizes.describe()}) spans pp_size * dp_replicate_size * fsdp_size * tp_size = {mesh} "
            f"ranks, but this launch has {world_size}. Accepted: sizes whose product is {world_size}, e.g. "
            f"DistributedConfig(fsdp_size={world_size}, ep_size=E) with E dividing {world_size} (token dispatch)."
        )
