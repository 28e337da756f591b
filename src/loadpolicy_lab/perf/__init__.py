"""`loadpolicy dev bench`: time and peak memory per rank of `from_pretrained` for every policy, against the ideal."""
