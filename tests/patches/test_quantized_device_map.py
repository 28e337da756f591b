"""ZeRO-3 refuses only a `device_map` the user passed: quantizers fill one in when none was (QLoRA under ZeRO-3).

Stock 5.23.0 checks the device map before `get_hf_quantizer`; the series decides it with the load policy, which is
known only after the quantizer, so it must check the map as passed in, not the one the quantizer filled in. The
end-to-end load (bitsandbytes 8-bit under ZeRO-3 on both trees) is in `loadpolicy dev validate`'s matrix. Needs the
patched tree installed (tox -e patches).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from transformers.integrations.accelerate import check_device_map_for_load_policy
from transformers.integrations.load_policy import LoadInputs, MetaShardOnRead, select_load_policy
from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING
from transformers.quantizers.base import HfQuantizer


FILLERS = sorted(
    name for name, cls in AUTO_QUANTIZER_MAPPING.items() if cls.update_device_map is not HfQuantizer.update_device_map
)
ZERO3_QUANTIZED = select_load_policy(LoadInputs(zero3_enabled=True, quantized=True))


def filled_device_map(name: str) -> Any:
    # update_device_map reads the torch device probes (and GGUF its `dequantize` flag), not the rest of the config:
    # skip the constructors' package checks
    quantizer = object.__new__(AUTO_QUANTIZER_MAPPING[name])
    quantizer.quantization_config = SimpleNamespace(dequantize=False)
    return quantizer.update_device_map(None)


def test_the_quantizers_that_fill_a_device_map_are_the_known_ones() -> None:
    # 5.23.0: bitsandbytes 4/8-bit, GPTQ, SINQ and Metal fill one in on this machine; GGUF only on MPS
    assert set(FILLERS) >= {"bitsandbytes_4bit", "bitsandbytes_8bit", "gptq", "sinq", "metal", "gguf"}
    filling = {name for name in FILLERS if filled_device_map(name) is not None}
    assert filling >= {"bitsandbytes_4bit", "bitsandbytes_8bit", "gptq", "sinq", "metal"}, filling


def test_zero3_with_a_quantized_model_shards_on_read() -> None:
    assert isinstance(ZERO3_QUANTIZED, MetaShardOnRead)


@pytest.mark.parametrize("name", FILLERS)
def test_a_device_map_the_quantizer_filled_in_is_not_refused(name: str) -> None:
    # from_pretrained checks the device_map passed in (None here), then loads with the one the quantizer filled in
    check_device_map_for_load_policy(None, ZERO3_QUANTIZED)
    filled = filled_device_map(name)
    if filled is None:
        pytest.skip(f"{name} fills no device_map on this machine")
    # ... which ZeRO-3 would refuse had the user passed it: checking after the quantizer breaks QLoRA under ZeRO-3
    with pytest.raises(ValueError, match="DeepSpeed Zero-3 is not compatible with passing a `device_map`"):
        check_device_map_for_load_policy(filled, ZERO3_QUANTIZED)


class _Checked(Exception):
    """Raised by the recording check: loading stops right after the device map was checked."""


def test_from_pretrained_checks_the_device_map_passed_in_not_the_filled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The order inside `from_pretrained` is what this guards: the quantizer fills a map, then the policy's check runs
    # on the map the user passed (None). Checking the filled one is what stock's order would amount to here.
    import transformers.modeling_utils as modeling_utils
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    quantizer = AUTO_QUANTIZER_MAPPING["bitsandbytes_8bit"]
    # bitsandbytes is not installed here: the check under test runs before any weight is quantized
    monkeypatch.setattr(quantizer, "validate_environment", lambda self, *args, **kwargs: None)
    checked: list[Any] = []

    def record(device_map: Any, load_policy: Any) -> None:
        checked.append((device_map, type(load_policy).__name__))
        raise _Checked

    monkeypatch.setattr(modeling_utils, "check_device_map_for_load_policy", record)
    zero3 = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        with pytest.raises(_Checked):
            LlamaForCausalLM.from_pretrained(tmp_path, quantization_config=BitsAndBytesConfig(load_in_8bit=True))
    finally:
        unset_hf_deepspeed_config()
        del zero3
    assert filled_device_map("bitsandbytes_8bit") is not None  # the quantizer does fill one in
    assert checked == [(None, "MetaShardOnRead")]
