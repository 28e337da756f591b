"""Real widths: published MoE shapes in Hub layout, loaded beside the cold-read limit and a peer reader."""
