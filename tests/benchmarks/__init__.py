"""The benchmark suite's code (layouts, measurement, reports, A/B runs)."""
