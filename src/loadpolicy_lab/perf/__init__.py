"""The performance suite: loads, reads, saves and a training step at the bench's sizes and published widths
(`loadpolicy dev perf KIND`, `perf.command`)."""
