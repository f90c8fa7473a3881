"""Context parallelism and its cost model."""
