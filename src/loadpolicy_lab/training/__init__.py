"""What the suites that train share: the spec of a training run, its steps on fixed data, its comparisons."""
