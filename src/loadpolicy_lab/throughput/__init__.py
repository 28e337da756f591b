"""`loadpolicy dev throughput`: training tokens/s per rank of each way to train an MoE under ZeRO-3, judged."""
