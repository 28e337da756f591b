"""How a launch runs: bounded launches in their own session, stage files, the trees, /proc readings."""
