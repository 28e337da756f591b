"""`loadpolicy dev autoep`: EP under ZeRO-3 beside DeepSpeed AutoEP, both against one process (a parity suite)."""
