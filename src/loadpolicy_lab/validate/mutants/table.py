"""The mutation table `loadpolicy dev mutants` runs: every row, by subject (one module each); the rows at a published
width apart (`--real-widths`)."""

from __future__ import annotations

from loadpolicy_lab.validate.mutants.row import Mutation
from loadpolicy_lab.validate.mutants.rows_agreement import AGREEMENT_ROWS
from loadpolicy_lab.validate.mutants.rows_device import DEVICE_ROWS
from loadpolicy_lab.validate.mutants.rows_loading import LOADING_ROWS
from loadpolicy_lab.validate.mutants.rows_reads import READS_ROWS
from loadpolicy_lab.validate.mutants.rows_saving import SAVING_ROWS
from loadpolicy_lab.validate.mutants.rows_training import TRAINING_ROWS
from loadpolicy_lab.validate.mutants.rows_widths import REAL_WIDTH_ROWS


MUTATIONS: tuple[Mutation, ...] = (
    *LOADING_ROWS,
    *READS_ROWS,
    *TRAINING_ROWS,
    *SAVING_ROWS,
    *AGREEMENT_ROWS,
    *DEVICE_ROWS,
)
# minutes each and a checkpoint of several GiB: run by name or with `--real-widths`, recorded like the rest
REAL_WIDTH_MUTATIONS: tuple[Mutation, ...] = REAL_WIDTH_ROWS
ALL_ROWS: tuple[Mutation, ...] = (*MUTATIONS, *REAL_WIDTH_MUTATIONS)
