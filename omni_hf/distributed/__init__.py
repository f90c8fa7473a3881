"""Distributed attention: context parallelism (one packed row split across the ranks of a process group)."""

from .context_parallel import (
                               ContextParallel,
                               ContextParallelCollator,
                               allowed_keys_per_query,
                               balanced_bounds,
                               token_work_in_pairs,
)
from .trainer import ContextParallelMixin

__all__ = ["ContextParallel", "ContextParallelCollator", "ContextParallelMixin", "allowed_keys_per_query",
           "balanced_bounds", "token_work_in_pairs"]
