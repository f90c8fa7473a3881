"""Interop with `torch.nn.attention.flex_attention.BlockMask`: its element rule as dense rows (for
`OmniBlockMask.from_flex`), and a Flex mask from a block table and a ``mask_mod`` (for `OmniBlockMask.to_flex`)."""

from __future__ import annotations

import torch

from .dense import RowFunction
from .lists import lists_from_table, scatter_lists
from .token_rule import MaskMod
from .types import CAUSAL, FULL, PARTIAL

__all__ = ["flex_rows", "to_flex"]


def flex_rows(block_mask) -> tuple[RowFunction, int, int]:
    """A Flex ``BlockMask``'s exact element rule (its full blocks allowed, its partial blocks where ``mask_mod``
    allows, the rest masked) as ``rows(start, stop) -> bool [B, H, stop - start, kv_len]``, and its B and H."""
    q_len, kv_len = block_mask.seq_lengths
    flex_q, flex_kv = block_mask.BLOCK_SIZE
    partial = _flex_block_table(block_mask.kv_num_blocks, block_mask.kv_indices, kv_len, flex_kv)
    full = (_flex_block_table(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, kv_len, flex_kv)
            if block_mask.full_kv_num_blocks is not None else torch.zeros_like(partial))
    batch, heads = partial.shape[:2]
    device = partial.device
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.arange(heads, device=device)[None, :, None, None]
    kv = torch.arange(kv_len, device=device)[None, None, None, :]

    def rows(start: int, stop: int) -> torch.Tensor:
        q = torch.arange(start, stop, device=device)[None, None, :, None]
        qb, kb = q // flex_q, kv // flex_kv
        allowed = block_mask.mask_mod(b, h, q, kv) & partial[b, h, qb, kb]
        return (allowed | full[b, h, qb, kb]).expand(batch, heads, stop - start, kv_len)

    return rows, batch, heads


def to_flex(types: torch.Tensor, mask_mod: MaskMod, q_len: int, kv_len: int, block_q: int, block_kv: int):
    """A Flex ``BlockMask`` of the block table ``types`` int8 ``[B, H, nQ, nK]``: FULL blocks become Flex's full
    blocks, CAUSAL and PARTIAL its partial blocks, evaluated by ``mask_mod`` (query rows as ``q_idx``)."""
    from torch.nn.attention.flex_attention import BlockMask

    partial_num, partial_idx = lists_from_table((types == CAUSAL) | (types == PARTIAL))
    full_num, full_idx = lists_from_table(types == FULL)
    return BlockMask.from_kv_blocks(partial_num, partial_idx, full_num, full_idx, BLOCK_SIZE=(block_q, block_kv),
                                    mask_mod=mask_mod, seq_lengths=(q_len, kv_len))


def _flex_block_table(num: torch.Tensor, indices: torch.Tensor, kv_len: int, block_kv: int) -> torch.Tensor:
    """bool ``[B, H, nQ, nK]``: which blocks a Flex list marks active."""
    return scatter_lists(num, indices, torch.ones_like(indices, dtype=torch.bool), -(-kv_len // block_kv), fill=False)
