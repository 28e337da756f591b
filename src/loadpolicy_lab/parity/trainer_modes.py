"""The parity modes that train through transformers' `Trainer`: the `Trainer` itself, TRL's `SFTTrainer`, and the TRL
recipe's reference under stock dense ZeRO-3. docs/training.md."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import transformers

from loadpolicy_lab.harness.device import (
    collective_device,
    host,
    rank_device,
    start_deepspeed_distributed,
    training_args_device_kwargs,
)
from loadpolicy_lab.parity.contract import ParitySpec, TrainedRank
from loadpolicy_lab.parity.worker import save_for_the_hub, trained_rank
from loadpolicy_lab.training.contract import SingleRun
from loadpolicy_lab.training.steps import (
    MICRO_BATCH,
    Stage,
    deepspeed_config,
    fixed_batches,
    freeze,
    gathered_weights,
    load_ep,
    loaded_state,
    unchanged_experts,
)


def _trains_with_trl(spec: ParitySpec) -> bool:
    """The TRL recipe, on the patched tree or as its reference under stock dense ZeRO-3."""
    return spec["mode"] in ("trl", "trl_reference")


def _training_arguments(spec: ParitySpec, world: int, out: Path) -> Any:
    from transformers import TrainingArguments  # noqa: PLC0415

    ds_config = deepspeed_config(spec, world) | {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}
    arguments: type[Any] = TrainingArguments
    extra: dict[str, Any] = {}
    if _trains_with_trl(spec):
        from trl import SFTConfig  # noqa: PLC0415

        # the rows are token ids already: no chat template, no tokenizing, no truncation
        arguments, extra = (
            SFTConfig,
            {"dataset_kwargs": {"skip_prepare_dataset": True}, "remove_unused_columns": False},
        )
    return arguments(
        **extra,
        output_dir=str(out / "trainer"),
        deepspeed=ds_config,
        per_device_train_batch_size=MICRO_BATCH,
        max_steps=spec["steps"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=spec["clip"],
        optim="sgd" if spec["optimizer"] == "sgd" else "adamw_torch",
        train_sampling_strategy="sequential",
        # resume cases: a checkpoint half-way (the HF weights and DeepSpeed's states), to resume from in a new launch
        save_strategy="steps" if spec["save_steps"] else "no",
        save_steps=spec["save_steps"] or 500,
        report_to="none",
        disable_tqdm=True,
        **training_args_device_kwargs(rank_device()),  # the CPU, or this rank's GPU
    )


def _trainer_class(spec: ParitySpec, trainer: type[Any]) -> type[Any]:
    """transformers' `Trainer`, or TRL's `SFTTrainer` (a `Trainer`) for the `trl` mode."""
    if not _trains_with_trl(spec):
        return trainer
    from trl import SFTTrainer  # noqa: PLC0415

    sft_trainer: type[Any] = SFTTrainer
    return sft_trainer


def _sft_data(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows as TRL takes them: a `datasets.Dataset` of token ids (TRL's collator makes the labels), and a
    word-level tokenizer over the 64 ids (TRL asks the tokenizer for its padding token; no row is padded)."""
    from datasets import Dataset  # noqa: PLC0415
    from tokenizers import Tokenizer, models  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    vocab = {f"t{i}": i for i in range(64)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), pad_token="t0", eos_token="t1"
    )
    dataset = Dataset.from_list([{"input_ids": row["input_ids"].tolist()} for row in rows])
    return {"train_dataset": dataset, "processing_class": tokenizer}


def train_with_trainer(spec: ParitySpec, stage: Stage, out: Path) -> TrainedRank:
    from transformers import Trainer, TrainerCallback  # noqa: PLC0415

    world = int(os.environ["WORLD_SIZE"])
    args = _training_arguments(spec, world, out)
    stage("from_pretrained")
    model = load_ep(spec, world) if spec["mode"] != "trl_reference" else _load_dense(spec)
    if spec["lora"]:
        stage("get_peft_model")
        model = with_lora(model)
    loaded = loaded_state(model)
    losses: list[float] = []

    class RecordingTrainer(_trainer_class(spec, Trainer)):  # type: ignore[misc]  # transformers is untyped here
        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            loss = super().compute_loss(*args, **kwargs)
            stage(f"step {len(losses)}")
            losses.append(float((loss[0] if isinstance(loss, tuple) else loss).item()))
            return loss

    unchanged: dict[str, bool] = {}

    class ExpertCheck(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *args: Any, model: Any = None, **kwargs: Any) -> None:
            # The Trainer has wrapped the model in DeepSpeed by now, before the first step.
            unchanged.update(unchanged_experts(loaded, model))

    # Sequential, in order: the Trainer hands replica d the d-th micro-batch of each global batch.
    rows = [{"input_ids": row, "labels": row} for batch in fixed_batches(spec, spec["steps"]) for row in batch]
    data: dict[str, Any] = {"train_dataset": rows}
    if _trains_with_trl(spec):
        data = _sft_data(rows)
    trainer = RecordingTrainer(model=model, args=args, callbacks=[ExpertCheck()], **data)
    stage("trainer.train")
    # A resumed launch records only the steps after the checkpoint
    trainer.train(resume_from_checkpoint=spec["resume_from"] or None)
    engine = trainer.model_wrapped
    if engine is model or not hasattr(engine, "module"):
        raise RuntimeError(
            f"the Trainer did not wrap the model in DeepSpeed (model_wrapped is {type(engine).__name__})"
        )
    stage("gather")
    result = trained_rank(loaded, unchanged, losses, gathered_weights(engine.module))
    if spec["export_dir"]:
        result["export"] = save_for_the_hub(spec, stage, trainer.save_model)
    return result


# Attention projections as modules, the experts' stacked weights as parameters (PEFT's `target_parameters`)
LORA_RANK = 2
LORA = {
    "r": LORA_RANK,
    "lora_alpha": 2 * LORA_RANK,
    "target_modules": ["q_proj", "v_proj"],
    "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
}


def with_lora(model: Any) -> Any:
    """The model with a LoRA adapter, every adapter weight set from a generator seeded by its name (B too, so that the
    first step moves every factor). An adapter of a rank's expert shard gets the blocks of the whole adapter that
    belong to the rank's experts: PEFT stacks experts as rows of `lora_A` (expert-major) and columns of `lora_B`
    (rank-major, expert-minor)."""
    import hashlib  # noqa: PLC0415

    from peft import LoraConfig, get_peft_model  # noqa: PLC0415
    from peft.tuners.lora.layer import ParamWrapper  # noqa: PLC0415

    model = get_peft_model(model, LoraConfig(**LORA))
    names = {id(p): n for n, p in model.named_parameters()}

    def whole(param: Any, shape: tuple[int, ...]) -> Any:
        seed = int(hashlib.sha256(names[id(param)].encode()).hexdigest()[:8], 16)
        return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 0.2

    with torch.no_grad():
        for module in model.modules():
            if not hasattr(module, "lora_A"):
                continue
            lora_a, lora_b = module.lora_A["default"].weight, module.lora_B["default"].weight
            experts, first, local = 1, 0, 1
            if isinstance(module, ParamWrapper):
                experts, first, local = _expert_blocks(module.get_param())
            rows = lora_a.shape[0] // local  # the LoRA rank
            lora_a.copy_(whole(lora_a, (rows * experts, lora_a.shape[1]))[first * rows : (first + local) * rows])
            b = whole(lora_b, (lora_b.shape[0], rows * experts)).reshape(lora_b.shape[0], rows, experts)
            lora_b.copy_(b[:, :, first : first + local].reshape(lora_b.shape))
    return model


def _expert_blocks(param: Any) -> tuple[int, int, int]:
    """(experts in the checkpoint, the first one this rank holds, how many it holds) of an expert parameter."""
    local = int(getattr(param, "ds_shape", param.shape)[0])
    if getattr(param, "ds_zero_placement_family", None) != "autoep_expert":
        return local, 0, local
    from transformers.integrations.deepspeed import checkpoint_rows  # noqa: PLC0415  # the patched tree's

    shape, first = checkpoint_rows(param)
    return int(shape[0]), int(first), local


def _load_dense(spec: ParitySpec) -> Any:
    """The model as stock dense ZeRO-3 loads it (the Trainer's arguments created the ZeRO-3 config already)."""
    model = getattr(transformers, spec["model_class"]).from_pretrained(spec["checkpoint"], dtype=torch.float32)
    model.train()
    freeze(model, spec["frozen"])
    return model


def trl_reference(spec: ParitySpec, stage: Stage, out: Path) -> SingleRun:
    """The TRL recipe under stock dense ZeRO-3 on as many ranks: the mean of the ranks' losses, the whole weights."""
    # Up before the Trainer's arguments read the world size (a load with a distributed config brings it up itself)
    start_deepspeed_distributed()
    trained = train_with_trainer(spec | {"export_dir": "", "save_steps": 0}, stage, out)
    losses = torch.tensor(trained["losses"], device=collective_device())
    torch.distributed.all_reduce(losses)
    return {"losses": host(losses / torch.distributed.get_world_size()).tolist(), "weights": trained["weights"]}
