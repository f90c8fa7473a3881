"""Distributed attention: context parallelism (one packed row split across the ranks of a process group)."""

from .context_parallel import ContextParallel, allowed_keys_per_query, balanced_bounds

__all__ = ["ContextParallel", "allowed_keys_per_query", "balanced_bounds"]
