"""What a model holds, tensor by tensor, without any weights: the input of the loading cost model.

`inventory_from_config` builds the model on the meta device from its config (a transformers config object or a
`config.json`), then asks transformers' own parallel plans how each parameter is placed: a parameter matched by the
EP plan is an expert tensor (sharded by expert on dim 0), one matched by the TP plan (EP rules take precedence, as in
`DistributedMixin._resolve_parallel_plans`) is split by TP, everything else is dense and whole. The result is plain
data (JSON round-trip), so the cost model itself stays pure and its tests need no torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadpolicy.errors import CommandError


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One parameter or persistent buffer of the model, in the dtype it is loaded in."""

    name: str
    shape: tuple[int, ...]
    nbytes: int
    expert: bool  # the EP plan shards it by expert (dim 0)
    tp_split: bool  # the TP plan splits it (only when not an expert)
    module: str  # the module that owns it: ZeRO-3 gathers a module's own parameters together

    @property
    def fused_experts(self) -> bool:
        """A 3-D expert tensor that a checkpoint with one key per expert is merged into while loading."""
        return self.expert and len(self.shape) == 3


@dataclass(frozen=True, slots=True)
class Inventory:
    model_type: str
    dtype: str
    num_experts: int
    entries: tuple[TensorEntry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    @property
    def expert_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries if e.expert)

    @property
    def dense_bytes(self) -> int:
        return self.total_bytes - self.expert_bytes

    @property
    def parameters(self) -> int:
        return self.total_bytes // DTYPE_BYTES[self.dtype]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Inventory:
        raw = json.loads(text)
        entries = tuple(TensorEntry(**(e | {"shape": tuple(e["shape"])})) for e in raw.pop("entries"))
        return cls(entries=entries, **raw)


def _num_experts(config: Any) -> int:
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return 0


def config_from_dict(raw: dict[str, Any]) -> Any:
    """A transformers config object from `config.json`'s fields (its `model_type` picks the class)."""
    from transformers import CONFIG_MAPPING, AutoConfig  # noqa: PLC0415  # the `live` extra: the cost model needs no torch

    if raw.get("model_type") not in CONFIG_MAPPING:
        raise ValueError(
            f"unknown model_type {raw.get('model_type')!r}; accepted: a model type transformers knows, e.g. "
            "qwen3_moe, mixtral, deepseek_v3 (all of them: sorted(transformers.CONFIG_MAPPING))"
        )
    fields = dict(raw)
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def _load_config(config: Any) -> Any:
    """A transformers config object from an object, a `config.json` path or a directory holding one."""
    if not isinstance(config, str | Path):
        return config
    return config_from_dict(read_config_file(Path(config)))


def read_config_file(path: Path) -> dict[str, Any]:
    """A `config.json` (or a directory holding one), with an error naming what is wrong with it."""
    file = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        where = f"{str(path)!r} has no config.json" if path.is_dir() else f"{str(file)!r} does not exist"
        raise CommandError(f"--config: {where}; accepted: a model's config.json or the directory holding it") from None
    except OSError as exc:
        raise CommandError(f"--config: cannot read {str(file)!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CommandError(
            f"--config: {str(file)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        found = type(raw).__name__ if not isinstance(raw, dict) else f"model_type {raw.get('model_type')!r}"
        raise CommandError(
            f"--config: {str(file)!r} names no model type ({found}); accepted: a transformers config.json with a "
            '"model_type" string, e.g. "qwen3_moe"'
        )
    return raw


def inventory_from_config(config: Any, dtype: str = "bfloat16") -> Inventory:
    """Build the causal-LM model of `config` on the meta device and list its tensors with their placements."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
    config = _load_config(config)  # a config file's errors first, with or without the `live` extra
    import torch  # noqa: PLC0415  # the `live` extra
    from transformers import AutoModelForCausalLM  # noqa: PLC0415
    from transformers.distributed.parallel_utils import _get_parameter_plan  # noqa: PLC0415

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    ep_plan, tp_plan = dict(model.ep_plan), dict(model.tp_plan)
    entries, seen = [], set()
    for module_name, module in model.named_modules():
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        persistent = {n for n, _ in own} - set(getattr(module, "_non_persistent_buffers_set", ()))
        for local_name, tensor in own:
            if local_name not in persistent or id(tensor) in seen:
                continue  # non-persistent buffers are computed, not read; tied weights are read once
            seen.add(id(tensor))
            name = f"{module_name}.{local_name}" if module_name else local_name
            expert = _get_parameter_plan(name, ep_plan) is not None
            split = not expert and (_get_parameter_plan(name, tp_plan) or "replicat").find("replicat") < 0
            entries.append(
                TensorEntry(
                    name=name,
                    shape=tuple(tensor.shape),
                    nbytes=tensor.numel() * tensor.element_size(),
                    expert=expert,
                    tp_split=split,
                    module=module_name,
                )
            )
    return Inventory(config.model_type, dtype, _num_experts(config), tuple(entries))
