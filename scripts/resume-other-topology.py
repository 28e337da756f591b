"""What resuming a DeepSpeed checkpoint of an EPMeta model on another topology does: one rank of a torchrun launch.

Save after one AdamW step at one topology, then load at another (token dispatch, `DistributedConfig(fsdp_size=W,
ep_size=EP)`), and print each rank's outcome. On the patched tree (build/validate/trees/patched after the main job):

    run="torchrun --nproc-per-node"
    PYTHONPATH=build/validate/trees/patched/src:src $run 4 scripts/resume-other-topology.py CKPT save OUT 2
    PYTHONPATH=build/validate/trees/patched/src:src $run 2 scripts/resume-other-topology.py CKPT load OUT 2
    PYTHONPATH=build/validate/trees/patched/src:src $run 4 scripts/resume-other-topology.py CKPT load OUT 4

CKPT: a tiny MoE checkpoint (build/validate/checkpoints/qwen3_moe). The last argument is the EP size of the launch.
"""

import os
import sys

import deepspeed
import torch
import transformers
from transformers import DistributedConfig
from transformers.integrations.deepspeed import HfDeepSpeedConfig


def main() -> None:
    checkpoint, mode, out, ep = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    config = {
        "zero_optimization": {"stage": 3},
        "train_batch_size": 2 * world,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "steps_per_print": 10_000,
    }
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841  # ZeRO-3 is on while it exists
    model = transformers.AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=torch.float32, distributed_config=DistributedConfig(fsdp_size=world, ep_size=ep)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    if mode == "save":
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(rank))
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        engine.save_checkpoint(out, tag="t")
        return
    try:
        engine.load_checkpoint(out, tag="t")
        print(f"rank {rank}: loaded", flush=True)
    except Exception as error:  # each rank reports what DeepSpeed said
        print(f"rank {rank}: {type(error).__name__}: {error}", flush=True)


if __name__ == "__main__":
    main()
