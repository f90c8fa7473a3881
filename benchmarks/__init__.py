"""Benchmark suite: omni vs FlexAttention vs SDPA vs eager (`python -m benchmarks.run`, see README.md)."""
