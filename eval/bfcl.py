"""BFCL (placeholder while written)."""
BENCHMARKS = []
