"""AttentionTrace: one sequence's tokens, maps and masks; its files (.npz/.json) and the checked reader."""
