"""Everything about the pinned upstream transformers tree: carrying the policy into it, and (later) the series."""
