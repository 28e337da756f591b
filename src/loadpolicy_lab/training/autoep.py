"""DeepSpeed AutoEP as the suites that run it (AutoEP, the bench, throughput) set it up: its config section and the
shim that lets DeepSpeed 0.19.8's AutoEP run on transformers 5.23.0.
"""

from __future__ import annotations

from typing import Any


def expert_parallel_section(arch: str, ep: int) -> dict[str, Any]:
    """AutoEP's config section (`module_inject/auto_ep_config.py`) for model type `arch`, experts over `ep` ranks."""
    return {
        "enabled": True,
        "autoep_size": ep,
        "preset_model": arch,  # the presets are named like the HF model types they cover
        # CPU: torch._grouped_mm's path applies the expert activation with a Triton kernel; the per-expert loop is
        # the path that runs in plain PyTorch.
        "use_grouped_mm": False,
    }


# --- COMPATIBILITY SHIM: DeepSpeed 0.19.8 AutoEP on transformers 5.23.0 (not part of the patch series) -------------
#
# transformers 5.23.0 keys its output-capture registry (`utils/output_capturing.py:39-53`) by model: `get(model)`
# looks up `str(model.__class__)` and takes no default; `registry[model] = ...` stores under `str(model.__class__)`.
# AutoEP (`module_inject/auto_ep_presets/base.py`) treats the registry as the plain dict it was, keyed by that string:
# `registry.get(key, default)` (line 326: "TypeError: _CanRecordRegistry.get() takes 2 positional arguments but 3
# were given", inside `deepspeed.initialize`), `registry.get(key)` (which would look up "<class 'str'>" and find
# nothing), and `registry[key] = entry` when it restores the entries it swapped in (stored under "<class 'str'>").
# The shim makes a key that already is a string behave as a plain dict key; a model behaves as before.


def apply_output_capture_registry_shim() -> bool:
    """Let AutoEP use transformers' `_CAN_RECORD_REGISTRY` with string keys. True if it changed anything."""
    from transformers.utils import output_capturing  # noqa: PLC0415  # the stock tree's, on its PYTHONPATH

    registry_class = type(output_capturing._CAN_RECORD_REGISTRY)
    if registry_class is dict or getattr(registry_class, "_loadpolicy_autoep_shim", False):
        return False
    get_by_model = registry_class.get
    set_by_model = registry_class.__setitem__

    def get(self: dict[str, Any], key: Any, *default: Any) -> Any:
        return dict.get(self, key, *default) if isinstance(key, str) else get_by_model(self, key)

    def setitem(self: dict[str, Any], key: Any, value: Any) -> None:
        if isinstance(key, str):
            dict.__setitem__(self, key, value)
        else:
            set_by_model(self, key, value)

    registry_class.get = get
    registry_class.__setitem__ = setitem
    registry_class._loadpolicy_autoep_shim = True
    return True
