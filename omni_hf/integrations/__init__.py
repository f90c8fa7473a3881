"""Integrations of omni attention with other libraries."""

from .transformers import register

__all__ = ["register"]
