"""Build a tiny Qwen3-MoE checkpoint from its config class (no download): `python examples/tiny_moe.py OUT`."""

import sys

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


config = Qwen3MoeConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    num_experts_per_tok=2,
)
torch.manual_seed(0)
Qwen3MoeForCausalLM(config).save_pretrained(sys.argv[1])
