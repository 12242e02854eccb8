"""LiveCodeBench v6 (placeholder while written)."""
BENCHMARKS = []
