"""Probe (issue 18): where a partition-read load spends its time, and what zero.Init's build-time broadcast costs.

Run on the patched tree (`loadpolicy checkout build/tf`), with the bench's checkpoints (`loadpolicy dev bench`):

    MALLOC_MMAP_THRESHOLD_=1048576 PYTHONPATH=build/tf/src OMP_NUM_THREADS=1 \
        torchrun --nproc-per-node 4 docs/results/zero-init-phases-probe.py build/bench/checkpoints/moe-850m \
        Qwen3MoeForCausalLM
    # the same with NO_BCAST=1: DeepSpeed's Init._zero_init_param without its broadcast, in this process only

Prints per rank when the model was built (zero.Init), when the partitions were read, and the total.
"""

import os
import sys
import time

import deepspeed
import torch
import torch.distributed as dist
import transformers
from deepspeed.runtime.zero.partition_parameters import Init
from transformers import modeling_utils
from transformers.integrations.deepspeed import HfDeepSpeedConfig


if os.environ.get("NO_BCAST"):

    def _zero_init_param_without_broadcast(self, param):
        self._convert_to_deepspeed_param(param)
        param.partition()

    Init._zero_init_param = _zero_init_param_without_broadcast

path, class_name = sys.argv[1], sys.argv[2]
deepspeed.init_distributed(dist_backend="gloo")
config = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 1}
keep_alive = HfDeepSpeedConfig(config)
times, start = {}, [0.0]
read_partitions = modeling_utils.load_zero3_partitions


def timed_read(*args):
    begin = time.perf_counter()
    read_partitions(*args)
    times["read"] = time.perf_counter() - begin


modeling_utils.load_zero3_partitions = timed_read
load_pretrained = modeling_utils.PreTrainedModel._load_pretrained_model


def timed_load(*args, **kwargs):
    times["built"] = time.perf_counter() - start[0]
    return load_pretrained(*args, **kwargs)


modeling_utils.PreTrainedModel._load_pretrained_model = staticmethod(timed_load)
model_class = getattr(transformers, class_name)
dist.barrier()
start[0] = time.perf_counter()
model = model_class.from_pretrained(path, dtype=torch.bfloat16)
total = time.perf_counter() - start[0]
phases = f"built at {times['built']:.2f}s, read {times['read']:.2f}s, total {total:.2f}s"
print(f"rank {dist.get_rank()}: {phases}", flush=True)
