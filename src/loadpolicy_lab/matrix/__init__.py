"""The load matrix: every scenario on both trees, launchers and world sizes, judged against the stock reference."""
