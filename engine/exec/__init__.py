"""Execution: the batched executor, its per-node hooks and trace, explanations, example queries."""
