"""Dense masks as typed blocks: classify a dense bool mask, given a few block rows at a time, into a block table and
a pool of bit-packed PARTIAL patterns (what `OmniBlockMask.from_dense`, `from_mask_fn` and `from_flex` build on)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .types import CAUSAL, FULL, MASKED, PARTIAL

__all__ = ["classify_rows", "dedupe_words", "empty_pool", "pack_patterns"]

DENSE_CHUNK_ELEMENTS = 1 << 24  # mask elements of one row chunk when a dense mask is evaluated

RowFunction = Callable[[int, int], torch.Tensor]


def classify_rows(rows: RowFunction, batch: int, heads: int, q_len: int, kv_len: int, block_q: int, block_kv: int,
                  device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Classify a dense mask given as ``rows(start, stop) -> bool [B, H, stop - start, kv_len]``, a few block rows
    at a time (about `DENSE_CHUNK_ELEMENTS` mask elements per call, read at each call so that tests can shrink it).

    Each chunk's PARTIAL patterns are bit-packed and numbered where they lie in the chunk's own block table, so the
    pool ids land on the right blocks whatever the batch, heads and chunking.

    Returns:
        types int8 ``[B, H, nQ, nK]``, pool ids int32 (same shape, -1 where none) and the deduplicated pool int32
        ``[P, block_q, block_kv // 32]``.
    """
    nq = -(-q_len // block_q)
    chunk = max(1, DENSE_CHUNK_ELEMENTS // max(1, batch * heads * block_q * kv_len))
    types, pattern_ids, words, count = [], [], [], 0
    for first in range(0, nq, chunk):
        start, stop = first * block_q, min((first + chunk) * block_q, q_len)
        t, p = _classify_dense_rows(rows(start, stop), start, q_len, kv_len, block_q, block_kv)
        ids = torch.full(t.shape, -1, dtype=torch.int64, device=device)
        ids[t == PARTIAL] = torch.arange(count, count + p.shape[0], device=device)
        types.append(t)
        pattern_ids.append(ids)
        words.append(pack_patterns(p, block_q, block_kv))
        count += p.shape[0]
    types, pattern_ids = torch.cat(types, dim=2), torch.cat(pattern_ids, dim=2)
    pool, pool_ids = dedupe_words(torch.cat(words), block_q, block_kv, device)
    partial = torch.full(types.shape, -1, dtype=torch.int32, device=device)
    pooled = pattern_ids >= 0
    partial[pooled] = pool_ids[pattern_ids[pooled]].to(torch.int32)
    return types, partial, pool


def _classify_dense_rows(dense, start, q_len, kv_len, block_q, block_kv) -> tuple[torch.Tensor, torch.Tensor]:
    """Classify the blocks of dense rows ``start:start+R`` (``start`` a multiple of ``block_q``).

    Args:
        dense: bool ``[B, H, R, kv_len]``.
    Returns:
        types int8 ``[B, H, ceil(R / block_q), nK]`` and the bool patterns ``[n, block_q, block_kv]`` of
        the PARTIAL blocks in row-major block order.
    """
    batch, heads, rows, _ = dense.shape
    nq, nk = -(-rows // block_q), -(-kv_len // block_kv)
    padded = torch.zeros(batch, heads, nq * block_q, nk * block_kv, dtype=torch.bool, device=dense.device)
    padded[:, :, :rows, :kv_len] = dense
    tiles = padded.view(batch, heads, nq, block_q, nk, block_kv).transpose(3, 4)
    row = torch.arange(start, start + nq * block_q, device=dense.device).view(nq, 1, block_q, 1)
    col = torch.arange(nk * block_kv, device=dense.device).view(1, nk, 1, block_kv)
    valid = (row < q_len) & (col < kv_len)
    causal = valid & (row + (kv_len - q_len) >= col)
    allowed = tiles.sum((-1, -2))
    is_full = allowed == valid.sum((-1, -2))
    is_causal = (tiles == causal).all(-1).all(-1)
    types = torch.where(allowed == 0, MASKED,
                        torch.where(is_full, FULL, torch.where(is_causal, CAUSAL, PARTIAL))).to(torch.int8)
    return types, tiles[types == PARTIAL]


def empty_pool(block_q: int, block_kv: int, device) -> torch.Tensor:
    """An empty pattern pool int32 ``[0, block_q, block_kv // 32]``."""
    return torch.zeros(0, block_q, block_kv // 32, dtype=torch.int32, device=device)


def pack_patterns(patterns: torch.Tensor, block_q: int, block_kv: int) -> torch.Tensor:
    """Bit-pack bool patterns ``[n, block_q, block_kv]`` into int32 words ``[n, block_q * block_kv // 32]``
    (bit ``j`` of word ``w`` of a row is key ``w * 32 + j``)."""
    bits = patterns.reshape(-1, block_q, block_kv // 32, 32).to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=patterns.device) << torch.arange(32, device=patterns.device)
    weights[31] = -(1 << 31)  # two's complement: bit 31 is the sign bit of an int32 word
    return (bits * weights).sum(-1).to(torch.int32).view(patterns.shape[0], block_q * block_kv // 32)


def dedupe_words(words: torch.Tensor, block_q, block_kv, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Deduplicate packed patterns ``[n, block_q * block_kv // 32]``.

    Returns the pool int32 ``[P, block_q, block_kv // 32]`` and each pattern's pool id int64 ``[n]``.
    """
    if words.shape[0] == 0:
        return empty_pool(block_q, block_kv, device), torch.zeros(0, dtype=torch.int64, device=device)
    pool, inverse = torch.unique(words, dim=0, return_inverse=True)
    return pool.view(-1, block_q, block_kv // 32).contiguous(), inverse
