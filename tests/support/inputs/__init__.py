"""Tensors for the cases of ``cases/<op>.json``, one module per op (shared by tests, benchmarks and the demo)."""
