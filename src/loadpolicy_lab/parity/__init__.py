"""Training parity: distributed training after loading against one process, saving and reloading included."""
