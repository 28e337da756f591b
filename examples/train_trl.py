"""Train a mixture-of-experts model with expert parallelism under DeepSpeed ZeRO-3 with TRL's SFTTrainer, then save a
Hub checkpoint.

torchrun --nproc-per-node 2 examples/train_trl.py CHECKPOINT OUT
"""

import sys

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models
from transformers import AutoModelForCausalLM, DistributedConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer


checkpoint, out = sys.argv[1], sys.argv[2]

# Before from_pretrained: creating the config creates the ZeRO-3 config, and from_pretrained loads for ZeRO-3 only
# when it exists. The SFTTrainer, a Trainer, refuses a model loaded with a distributed_config before it.
args = SFTConfig(
    output_dir=out,
    # "auto": the Trainer fills these in from the arguments below
    deepspeed={
        "zero_optimization": {"stage": 3},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    },
    per_device_train_batch_size=1,
    num_train_epochs=1,
    learning_rate=1e-3,
    lr_scheduler_type="constant",
    weight_decay=0.0,
    max_grad_norm=1.0,
    optim="adamw_torch",
    # Rows in order: each step takes the next row for every rank (rank 0 the first of them)
    train_sampling_strategy="sequential",
    bf16=False,  # TRL turns bf16 on by default; this model was saved and is loaded in float32
    # The rows are token ids already: no chat template, no tokenizing, no truncation
    dataset_kwargs={"skip_prepare_dataset": True},
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=not torch.cuda.is_available(),  # CPU ranks talk over gloo, GPUs over NCCL
)
model = AutoModelForCausalLM.from_pretrained(
    checkpoint,
    dtype=torch.float32,
    # Token dispatch: every rank trains its own batch, each rank holds num_experts / ep_size experts, tokens reach
    # them by all-to-all, and ZeRO-3 partitions everything else over the world.
    distributed_config=DistributedConfig(fsdp_size=args.world_size, ep_size=args.world_size),
)

# The tiny model has no tokenizer, and TRL asks one for the padding token: a word-level one over the model's ids.
# With a real model, pass its own tokenizer.
vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), pad_token="t0"
)

# Your dataset here. TRL makes the labels from the input ids.
rows = torch.randint(0, model.config.vocab_size, (6, 16), generator=torch.Generator().manual_seed(0))
dataset = Dataset.from_dict({"input_ids": rows.tolist()})

# TRL adds the model's load-balancing loss (router_aux_loss_coef of its config) to every rank's loss
trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
trainer.train()  # 6 rows, 1 per rank per step: 3 steps on 2 ranks
trainer.save_model(out)  # one Hub checkpoint; every rank writes its own partitions
