"""One rank of a validation run (`torchrun -m` or `accelerate launch -m loadpolicy_lab.matrix.worker SPEC OUT`).

For every architecture of the run: ZeRO-3 is switched on the way the launcher's users do it (an `HfDeepSpeedConfig`
under torchrun, an `Accelerator` under accelerate launch), and each model is loaded the distributed way and checked,
parameter by parameter and on its logits, against the stock tree's one-process load of the same checkpoint
(`reference.py`, written before the run). Every rank writes its own
result file, and a stage file saying where it is, so a timeout can report where each rank was (`harness/rank.py`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from loadpolicy_lab.harness.device import RankDevice, accelerator_kwargs_handlers, host, rank_device, to_device
from loadpolicy_lab.harness.rank import Rank, run_rank
from loadpolicy_lab.harness.setup import show_zero3
from loadpolicy_lab.matrix.contract import ExpertSlice, LoadCheck, MatrixCase, MatrixSpec
from loadpolicy_lab.models.reference import input_ids, load_reference, model_output


def _local(tensor: Any) -> Any:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _whole(tensor: Any) -> Any:
    """A DTensor's full value (a collective: every rank calls it in the same parameter order), else the tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _equal(tensor: Any, reference: Any) -> bool:
    import torch

    return reference is not None and tensor.shape == reference.shape and bool(torch.equal(host(tensor), reference))


def _quantization(spec: MatrixSpec) -> dict[str, Any]:
    """from_pretrained's quantization argument, for the reference load and the distributed one alike."""
    if not spec["bnb_8bit"]:
        return {}
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)}


def _enable_zero3(spec: MatrixSpec, device: RankDevice) -> Any:
    """Make `is_deepspeed_zero3_enabled()` true the way this launcher's users do."""
    if spec["launcher"] == "accelerate":
        from accelerate import Accelerator

        return Accelerator(kwargs_handlers=accelerator_kwargs_handlers(device))
    return show_zero3(spec["zero3_config"])


def _check(rank: Rank, spec: MatrixSpec, case: MatrixCase, reference: dict[str, Any], ids: Any) -> LoadCheck:
    import torch
    import transformers
    from transformers import DistributedConfig

    kwargs: dict[str, Any] = {"dtype": torch.float32, "output_loading_info": True, **_quantization(spec)}
    if spec["distributed"] is not None:
        kwargs["distributed_config"] = DistributedConfig(**spec["distributed"])
    model_class = getattr(transformers, case["model_class"])
    model, info = model_class.from_pretrained(case["checkpoint"], **kwargs)
    policy = getattr(model, "_load_policy", None)
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    result: LoadCheck = {
        "policy": None if policy is None else type(policy).__name__,
        "loading_branch": None if policy is None else policy.loading_branch.value,
        "missing_keys": sorted(info["missing_keys"]),
        "unexpected_keys": sorted(info["unexpected_keys"]),
        "mismatched_keys": sorted(str(k) for k in info["mismatched_keys"]),
        "on_meta": [name for name, tensor in tensors if _local(tensor).is_meta],
        "partitioned": sum(hasattr(p, "ds_id") for _, p in model.named_parameters()),
        "parameters": sum(1 for _ in model.named_parameters()),
        "quantized_8bit": sum(type(p).__name__ == "Int8Params" for p in model.parameters()),
    }
    params = reference["params"]
    # On GPUs (nccl) the model sits on this rank's device; the reference stays on the CPU, results come back to it.
    ids = to_device(ids, next(model.parameters()).device)
    # ZeRO-3 parameters (dense ZeRO-3; EP under ZeRO-3 with partition reads) are compared and run gathered
    gathered: AbstractContextManager[object] = nullcontext()
    if result["partitioned"]:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(model.parameters()))
    with gathered:
        if result["partitioned"] and spec["distributed"] is None:
            result["gathered_unequal"] = [n for n, p in model.named_parameters() if not _equal(p.data, params.get(n))]
        else:
            sharded = spec["distributed"] is not None
            result["experts"], result["dense_unequal"] = _compare_expert_shards(model, params, rank, sharded)
        with torch.no_grad():
            logits = host(_local(model_output(model(input_ids=ids))))
    result["max_abs_diff"] = float((logits - reference["logits"]).abs().max())
    saving = getattr(policy, "saving_branch", None)
    if saving is not None and saving.value == "zero3_write_partitions":
        rank.stage(f"{case['arch']}: save_pretrained")
        result["saved_unequal"] = _saved_unequal(model, Path(case["checkpoint"]), rank.out / f"saved-{case['arch']}")
    return result


def _saved_unequal(model: Any, checkpoint: Path, directory: Path) -> list[str]:
    """Save on every rank (each writes its partitions), then the names whose tensors differ from the checkpoint's own
    (nothing was trained: the files must hold the checkpoint), or are missing or extra on either side."""
    import torch
    from safetensors.torch import load_file

    model.save_pretrained(directory)

    def tensors(where: Path) -> dict[str, Any]:
        return {k: v for f in sorted(where.glob("*.safetensors")) for k, v in load_file(f).items()}

    saved, expected = tensors(directory), tensors(checkpoint)
    differing = [n for n in expected if n in saved and not torch.equal(saved[n], expected[n])]
    return sorted(set(saved) ^ set(expected)) + differing


def _compare_expert_shards(
    model: Any, params: dict[str, Any], rank: Rank, sharded: bool
) -> tuple[dict[str, ExpertSlice], list[str]]:
    """With `sharded` experts, each shard against this rank's slice of the reference; the rest against the whole."""
    import torch

    experts: dict[str, ExpertSlice] = {}
    dense_unequal: list[str] = []
    for name, param in model.named_parameters():
        # stacked expert tensors lead with the expert dimension; a 1-D tensor under `.experts.` is one module's own
        # (muse_spark's post_expert_norm) and every rank holds it whole
        if sharded and ".experts." in name and params[name].dim() > 1:
            full, shard = params[name], host(_local(param.data))
            n = full.shape[0] // rank.world_size
            expected = full[rank.rank * n : (rank.rank + 1) * n]
            equal = bool(torch.equal(shard, expected))
            experts[name] = {"local": list(shard.shape), "full": list(full.shape), "equal": equal}
        elif not _equal(_whole(param.data), params.get(name)):
            dense_unequal.append(name)
    return experts, dense_unequal


def _load_every_case(rank: Rank, spec: MatrixSpec) -> dict[str, Any]:
    import torch
    import transformers

    # The runner checks this: a stale install must not stand in for the tree under test.
    rank.facts["transformers_file"] = transformers.__file__
    # Kept in the facts, so that a fatal error still reports the architectures that ran.
    results: dict[str, LoadCheck] = rank.facts.setdefault("results", {})
    # one GPU per rank (made current) or the CPU; nothing starts a process group here: the load does, as users' do
    device = rank_device()
    torch.manual_seed(0)
    ids = input_ids()
    rank.stage("read the stock tree's one-process references")
    references = {case["arch"]: load_reference(Path(case["reference"])) for case in spec["cases"]}
    if spec["zero3"]:
        rank.stage("enable ZeRO-3")
        keep_alive = _enable_zero3(spec, device)  # noqa: F841  # HfDeepSpeedConfig is held by a weak reference
    for index, case in enumerate(spec["cases"]):
        rank.stage(f"{case['arch']}: from_pretrained")
        try:
            results[case["arch"]] = _check(rank, spec, case, references[case["arch"]], ids)
        except Exception as exc:  # recorded per architecture; the next one still runs if the ranks can load together
            failure = rank.failure(exc)
            results[case["arch"]] = {"error": failure["error"], "stage": failure["stage"]}
            results[case["arch"]]["traceback"] = failure["traceback"]
            if not torch.distributed.is_initialized():
                _record_not_loaded(results, spec["cases"][index + 1 :], case["arch"])
                break
    return {}


def _record_not_loaded(results: dict[str, LoadCheck], cases: list[MatrixCase], failed: str) -> None:
    """A collective load that fails aborts the process group (the patched tree), so that no rank waits in a
    collective for a peer that has gone; a new one on the same store would read the aborted group's addresses (torch
    keys them by a group count the abort resets), so the ranks cannot load together again in this launch."""
    for case in cases:
        results[case["arch"]] = {
            "error": f"not loaded: the failed load of {failed} left no process group to load it with",
            "stage": f"{case['arch']}: not started",
        }


if __name__ == "__main__":
    run_rank(_load_every_case, MatrixSpec)
