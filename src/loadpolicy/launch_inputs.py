"""One launch as the command line describes it (a DeepSpeed config and `DistributedConfig` sizes), validated once.

`explain` and `doctor` both read a launch through `read_launch`, so a launch one of them refuses the other refuses
with the same message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadpolicy.dsconfig import check_sections, keeps_flat_partitions, read_config, zero_stage_of
from loadpolicy.errors import CommandError
from loadpolicy.policy import LoadInputs, PolicyName, explain_selection
from loadpolicy.sizes import RawSizes, normalise_sizes


@dataclass(frozen=True, slots=True)
class Launch:
    """A validated launch: the parsed DeepSpeed config (None: none), its ZeRO stage, and the selector's inputs."""

    config: dict[str, object] | None
    stage: int
    inputs: LoadInputs
    warnings: tuple[str, ...] = ()


def read_launch(
    config: Path | dict[str, object] | None,
    raw: RawSizes,
    *,
    source: str | None = None,
    world_size: int = 1,
    quantized: bool = False,
    outer_zero3_init: bool = False,
    requested: PolicyName | None = None,
) -> Launch:
    """Read and check the DeepSpeed config (a file, or a config already parsed that `source` names in messages),
    normalise the sizes as transformers does, and run the selector once, so any launch `from_pretrained` would refuse
    is refused here, naming the bad value and what is accepted."""
    if isinstance(config, Path):
        source, config = f"DeepSpeed config {str(config)!r}", read_config(config)
    stage = 0
    if config is not None:
        stage = zero_stage_of(config, source=source or "DeepSpeed config")
        check_sections(config, source=source or "DeepSpeed config")
    if requested in (PolicyName.ZERO3_INIT, PolicyName.EP_META) and stage != 3:
        raise CommandError(
            f"--policy {requested} loads under DeepSpeed ZeRO-3, and this launch has "
            + ("no DeepSpeed config" if config is None else f"ZeRO stage {stage}")
            + ": pass --deepspeed-config FILE with zero_optimization.stage = 3 (examples/ds_zero3.json); "
            "without ZeRO-3 the accepted policy is MetaShardOnRead."
        )
    normalised = normalise_sizes(raw, world_size=world_size)
    sizes = normalised.sizes
    if config is not None and stage != 3 and sizes.expert_parallel:
        # transformers refuses this load at `from_pretrained`: DeepSpeed cannot wrap the DTensors EP shards into, and
        # only under ZeRO-3 does the load policy load EP for it (`deepspeed.initialize`: "Couldn't swap ...weight")
        raise CommandError(
            f"{source or 'DeepSpeed config'} has ZeRO stage {stage}, and DistributedConfig({raw.describe()}) shards "
            "the experts into DTensors, which DeepSpeed cannot wrap: from_pretrained refuses this load. Accepted: "
            "zero_optimization.stage = 3 (examples/ds_zero3.json), or no DeepSpeed config."
        )
    inputs = LoadInputs(
        zero3_enabled=stage == 3,
        quantized=quantized,
        outer_zero3_init=outer_zero3_init,
        zero3_flat_partitions=config is not None and keeps_flat_partitions(config),
        sizes=sizes,
        requested=requested,
    )
    explain_selection(inputs)  # raises LoadPolicyError for what from_pretrained would refuse
    return Launch(config, stage, inputs, normalised.warnings)
