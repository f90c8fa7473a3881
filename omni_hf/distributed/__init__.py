"""Distributed attention: context parallelism (one packed row split across the ranks of a process group)."""

from .context_parallel import (
                               SCHEDULES,
                               ContextParallel,
                               ContextParallelCollator,
                               Topology,
                               allowed_keys_per_query,
                               balanced_bounds,
                               token_work_in_pairs,
)
from .trainer import ContextParallelMixin

__all__ = ["SCHEDULES", "ContextParallel", "ContextParallelCollator", "ContextParallelMixin", "Topology",
           "allowed_keys_per_query", "balanced_bounds", "token_work_in_pairs"]
