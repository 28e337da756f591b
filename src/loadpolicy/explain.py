"""Say which policy a launch gets, and what each decision means, before anyone spends GPU hours finding out."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from loadpolicy.policy import (
    AfterLoading,
    DenseWeights,
    DeviceMapRule,
    InitContext,
    LoadingBranch,
    LoadInputs,
    LoadPolicy,
    MissingKeys,
    SavingBranch,
    WeightInit,
    decision_table,
    explain_selection,
)


# One line per decision value: what transformers does when the policy answers this.
_MEANING: dict[enum.Enum | bool, str] = {
    InitContext.ZERO3_INIT: "build under deepspeed.zero.Init: parameters are partitioned as they are created",
    InitContext.OUTER_ZERO3_INIT: "build inside the zero.Init the caller already opened; add no context",
    InitContext.META: "build on the meta device (meta-safe creation ops); nothing is allocated until loading",
    InitContext.META_QUANTIZED: "build on the meta device marked as quantized (the quantizer replaces modules)",
    True: "a nested _from_config (composite models) opens its own zero.Init",
    False: "a nested _from_config (composite models) builds in the parent's context",
    DeviceMapRule.REFUSE: "any device_map is an error: ZeRO-3 places the parameters",
    DeviceMapRule.ADMIT_MESH_BOUND: "admit the mesh-bound {'': local_device} and keep it: shards land on this rank",
    DeviceMapRule.PASS_THROUGH: "use the device_map as given",
    LoadingBranch.ZERO3_GATHER_AND_COPY: "rank 0 reads the checkpoint; each module is gathered, copied, repartitioned",
    LoadingBranch.ZERO3_READ_PARTITIONS: "every rank reads from the files only its ZeRO-3 partition of each parameter",
    LoadingBranch.SHARD_ON_READ: "every rank converts and reads only the slices it owns",
    MissingKeys.LEAVE_TO_ZERO3: "skip: buffers and missing keys stay with ZeRO-3's partitioned parameters",
    MissingKeys.MATERIALIZE: "move non-persistent buffers and missing keys off the meta device",
    WeightInit.GATHERED: "initialize missing weights inside GatheredParameters (modifier rank 0)",
    WeightInit.PLAIN: "initialize missing weights on the local tensors",
    DenseWeights.AS_PLANNED: "dense weights are sharded at load time as the TP plan says (whole without a rule)",
    DenseWeights.LEFT_TO_ZERO3: "no TP plan: ZeRO-3 partitions dense weights (at load when it reads partitions)",
    AfterLoading.AS_LOADED: "return the model as loaded",
    AfterLoading.DEEPSPEED_EXPERT_GROUPS: "expert shards become plain parameters in DeepSpeed's expert groups",
    SavingBranch.GATHER_TO_WRITER: "save_pretrained gathers every parameter whole to the writing rank",
    SavingBranch.ZERO3_WRITE_PARTITIONS: "save_pretrained: every rank writes its own partitions into the files",
}


@dataclass(frozen=True, slots=True)
class Explanation:
    inputs: LoadInputs
    policy: LoadPolicy
    reason: str
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        sizes = self.inputs.sizes
        return {
            "policy": self.policy.name.value,
            "reason": self.reason,
            "inputs": {
                "zero3_enabled": self.inputs.zero3_enabled,
                "quantized": self.inputs.quantized,
                "outer_zero3_init": self.inputs.outer_zero3_init,
                "zero3_flat_partitions": self.inputs.zero3_flat_partitions,
                "requested": None if self.inputs.requested is None else self.inputs.requested.value,
                "tp_size": sizes.tp,
                "ep_size": sizes.ep,
                "fsdp_size": sizes.fsdp,
                "pp_size": sizes.pp,
                "dp_replicate_size": sizes.dp_replicate,
            },
            "decisions": {
                gate: {"value": _value(choice), "meaning": _MEANING[choice]}
                for gate, choice in decision_table(self.policy).items()
            },
            "warnings": list(self.warnings),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False)

    def to_text(self) -> str:
        lines = [f"policy: {self.policy.name.value}  ({self.reason})"]
        for gate, choice in decision_table(self.policy).items():
            lines.append(f"  {gate:<37} {_value(choice):<22} {_MEANING[choice]}")
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        return "\n".join(lines)


def _value(choice: enum.Enum | bool) -> str:
    return str(choice).lower() if isinstance(choice, bool) else str(choice.value)


def explain(inputs: LoadInputs, warnings: tuple[str, ...] = ()) -> Explanation:
    """Select the policy for `inputs` and describe every decision; raises `LoadPolicyError` like the selector."""
    policy, reason = explain_selection(inputs)
    return Explanation(inputs=inputs, policy=policy, reason=reason, warnings=warnings)
