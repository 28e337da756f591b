"""The save benchmark: partition writes beside the gathered save, DeepSpeed's 16-bit save and the write limit."""
