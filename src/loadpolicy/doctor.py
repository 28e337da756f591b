"""Check a DeepSpeed config (and the installed DeepSpeed) for known ZeRO-3 failures.

Validates the launch as `loadpolicy explain` does, then reports: disagreeing offload devices, and the device bug of
DeepSpeed 0.14.1-0.14.4 in `unscale_and_clip_grads`; parameters replaced after `deepspeed.initialize`, which break
`save_checkpoint`; and, given the launch's DistributedConfig sizes, AutoEP enabled beside transformers' EP (an
error) and the shared-batch EP shape (a note pointing at token dispatch). See README.md.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from loadpolicy.policy import LoadPolicyError, ParallelSizes


OFFLOAD_FIX = (0, 14, 5)
OFFLOAD_BUG_INTRODUCED = (0, 14, 1)


class Severity(enum.StrEnum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    check: str
    message: str


def parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if match is None:
        raise LoadPolicyError(f"Cannot read DeepSpeed version {text!r}; expected MAJOR.MINOR[.PATCH], e.g. 0.19.8.")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _offload_device(zero: dict[str, object], key: str) -> str:
    section = zero.get(key)
    if not isinstance(section, dict):
        return "none"
    return str(section.get("device", "none")).lower()


def _offload_findings(zero: dict[str, object], deepspeed_version: str | None) -> list[Finding]:
    optimizer, param = _offload_device(zero, "offload_optimizer"), _offload_device(zero, "offload_param")
    version = None if deepspeed_version is None else parse_version(deepspeed_version)
    affected = version is not None and OFFLOAD_BUG_INTRODUCED <= version < OFFLOAD_FIX
    findings = []
    if affected and optimizer != "none":
        findings.append(
            Finding(
                Severity.ERROR,
                "deepspeed-version",
                f"DeepSpeed {deepspeed_version} with ZeRO-3 and offload_optimizer.device={optimizer!r} fails in "
                "unscale_and_clip_grads with 'Expected all tensors to be on the same device' (DeepSpeed #5422, "
                "#5538; broken in 0.14.1 by #5256, fixed in 0.14.3 by #5493 and 0.14.5 by #5504). Accepted: "
                "deepspeed >= 0.14.5, or offload_optimizer.device='none'.",
            )
        )
    if optimizer != param:
        findings.append(
            Finding(
                Severity.WARNING,
                "offload-devices",
                f"offload_optimizer.device={optimizer!r} but offload_param.device={param!r}: optimizer state and "
                "parameters live on different devices. DeepSpeed 0.14.1-0.14.4 mixed them up in "
                "unscale_and_clip_grads; set both alike unless this split is what you want.",
            )
        )
    return findings


def _expert_parallel_findings(config: dict[str, object], sizes: ParallelSizes) -> list[Finding]:
    autoep = config.get("expert_parallel", {})
    findings = []
    if sizes.expert_parallel and isinstance(autoep, dict) and autoep.get("enabled"):
        findings.append(
            Finding(
                Severity.ERROR,
                "two-expert-parallelisms",
                f"The DeepSpeed config enables AutoEP (expert_parallel.enabled) and the launch loads with "
                f"ep_size={sizes.ep}: AutoEP would replace MoE blocks whose experts transformers already sharded. "
                "Accepted: one of them (AutoEP with no EP in the DistributedConfig, or EP with expert_parallel off).",
            )
        )
    if sizes.expert_parallel and sizes.tp == sizes.ep:
        findings.append(
            Finding(
                Severity.NOTE,
                "shared-batch-ep",
                f"DistributedConfig(tp_size={sizes.tp}, ep_size={sizes.ep}): the {sizes.ep} ranks of each EP group "
                "train one batch and run every dense layer on it; DistributedConfig(fsdp_size=<world size>, "
                f"ep_size={sizes.ep}) gives every rank its own batch and sends tokens to their experts by all-to-all.",
            )
        )
    return findings


def check_deepspeed_config(
    config: dict[str, object], deepspeed_version: str | None, sizes: ParallelSizes | None = None
) -> list[Finding]:
    """Findings for a parsed DeepSpeed config and the DeepSpeed version that will run it (None: not installed), and,
    given the launch's `DistributedConfig` sizes, for EP beside it."""
    zero = config.get("zero_optimization", {})
    zero = zero if isinstance(zero, dict) else {}
    findings = _offload_findings(zero, deepspeed_version) if zero.get("stage") == 3 else []
    findings += _expert_parallel_findings(config, sizes or ParallelSizes())
    findings.append(
        Finding(
            Severity.NOTE,
            "placement-before-initialize",
            "Make every placement final before deepspeed.initialize: no accelerate dispatch_model, no .to(device) "
            "and no replaced Parameter objects afterwards, or save_checkpoint fails with 'failed to find frozen "
            "param in named params' for frozen parameters (DeepSpeed #6620).",
        )
    )
    return findings
