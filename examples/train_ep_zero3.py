"""Train a mixture-of-experts model with expert parallelism under DeepSpeed ZeRO-3, then save a Hub checkpoint.

torchrun --nproc-per-node 2 examples/train_ep_zero3.py CHECKPOINT OUT
"""

import os
import sys

import deepspeed
import torch
from transformers import AutoModelForCausalLM, DistributedConfig
from transformers.integrations import HfDeepSpeedConfig


checkpoint, out = sys.argv[1], sys.argv[2]
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
ds_config = {
    "zero_optimization": {"stage": 3},
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 1.0,
}

# Before from_pretrained, on every rank, and kept alive: this is how transformers sees that ZeRO-3 is on.
ds = HfDeepSpeedConfig(ds_config)
model = AutoModelForCausalLM.from_pretrained(
    checkpoint,
    dtype=torch.float32,
    # Token dispatch: every rank trains its own batch, each rank holds num_experts / ep_size experts, tokens reach
    # them by all-to-all, and ZeRO-3 partitions everything else over the world.
    distributed_config=DistributedConfig(fsdp_size=world, ep_size=world),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

batches = torch.Generator().manual_seed(rank)  # your data loader here: each rank its own batch
for step in range(3):
    input_ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=batches).to(engine.device)
    loss = engine(input_ids=input_ids, labels=input_ids).loss
    engine.backward(loss)
    engine.step()
    print(f"rank {rank} step {step}: loss {loss.item():.4f}")

engine.module.save_pretrained(out)  # one Hub checkpoint; each rank writes its own partitions
