"""Bad input: each case ends with a clear error on every rank, fast, with nothing left running."""
