"""`loadpolicy dev perf KIND`: the performance suite's one command, a kind of run each.

`bench` (every policy's load at the bench's sizes), `calibrate` (the cost model against a bench run), `save` (each way
of saving a loaded model), `widths` (published MoE shapes at full width, every way of reading in one run), `rounds`
(any set of ways and trees at real width, in interleaved rounds) and `step` (one training step at real width against
one process).
"""

from __future__ import annotations

import argparse

from loadpolicy_lab.perf import calibrate, rounds, run, save_run, step_run, widths_run


HELP = "the performance suite: loads, reads, saves and a training step, at the bench's sizes and published widths"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    perf = subparsers.add_parser("perf", help=HELP)
    kinds = perf.add_subparsers(dest="perf_kind", metavar="KIND", required=True)
    for module in (run, calibrate, save_run, widths_run, rounds, step_run):
        module.add_parser(kinds)
