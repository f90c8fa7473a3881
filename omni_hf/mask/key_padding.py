"""Bidirectional attention over the real keys as typed blocks (what `OmniBlockMask.from_key_padding` builds)."""

from __future__ import annotations

import torch

from .dense import pack_patterns
from .types import PARTIAL, block_type

__all__ = ["key_padding_table"]


def key_padding_table(key_padding: torch.Tensor, q_len: int, block_q: int,
                      block_kv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block table of "every query row sees every real key".

    Args:
        key_padding: bool ``[B, kv_len]``, True = a real key.
    Returns:
        types int8 ``[B, 1, nQ, nK]`` (FULL, MASKED, or PARTIAL where a key block is part padding), pool ids int32
        of the same shape, and the pool int32 ``[B * nK, block_q, block_kv // 32]``: one entry per batch row and
        key block (shapes depend on sizes only: no host sync). O(B * kv_len * block_q / 32).
    """
    batch, kv_len = key_padding.shape
    num_q, num_kv = -(-q_len // block_q), -(-kv_len // block_kv)
    keys = torch.nn.functional.pad(key_padding, (0, num_kv * block_kv - kv_len)).view(batch, num_kv, block_kv)
    real = keys.sum(-1)
    in_range = torch.full((num_kv,), block_kv, device=keys.device)
    in_range[-1] = kv_len - (num_kv - 1) * block_kv
    full, masked = real == in_range, real == 0
    kinds = block_type(masked, full, torch.zeros_like(full))  # [B, nK]: FULL, MASKED or PARTIAL
    words = pack_patterns(keys.reshape(batch * num_kv, 1, block_kv), 1, block_kv)  # [B * nK, block_kv / 32]
    pool = words[:, None].expand(-1, block_q, -1).contiguous()
    entry = torch.arange(batch * num_kv, dtype=torch.int32, device=keys.device).view(batch, num_kv)
    pool_ids = torch.where(kinds == PARTIAL, entry, -1)
    return (kinds[:, None, None].expand(batch, 1, num_q, num_kv).contiguous(),
            pool_ids[:, None, None].expand(batch, 1, num_q, num_kv).contiguous(), pool)
