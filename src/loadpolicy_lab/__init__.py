"""The maintainer's lab: the multi-process harness, its suites (matrix, parity, faults, bench, widths, ...) and the
mutation table, run by `loadpolicy dev`. A checkout's editable install carries it; the wheel a user installs does
not."""
