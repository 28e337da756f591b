"""Tiny checkpoints the project builds from config classes, and the stock tree's one-process reference of each."""
