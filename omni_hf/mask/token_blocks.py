"""The token rule as typed blocks: block summaries (least / greatest doc and group id of every block) classify each
(Q block, KV block) pair without anything of size ``S x S`` (what `OmniBlockMask.from_token_ids` builds with
PyTorch ops), and the blocks the kernels derive for implicit masks."""

from __future__ import annotations

import torch

from .types import CAUSAL, FULL, MASKED, PARTIAL, MaskKind, block_type

__all__ = ["BlockPositions", "classify_token_blocks", "classify_token_range_blocks", "implicit_block_table",
           "token_range_patterns"]

INT32_MAX = torch.iinfo(torch.int32).max


class BlockPositions:
    """Absolute first / last positions of every Q block and KV block, as broadcastable ``[nQ, nK]``
    comparisons. Queries start at position ``q_offset`` (default ``kv_len - q_len``: bottom-right aligned), keys
    at ``k_offset``."""

    def __init__(self, q_len: int, kv_len: int, block_q: int, block_kv: int, device: torch.device,
                 q_offset: int | None = None, k_offset: int = 0):
        offset = kv_len - q_len if q_offset is None else q_offset
        q_start = torch.arange(0, q_len, block_q, dtype=torch.int32, device=device)
        k_start = torch.arange(0, kv_len, block_kv, dtype=torch.int32, device=device)
        self.q_first = (q_start + offset)[:, None]
        self.q_last = ((q_start + block_q).clamp(max=q_len) - 1 + offset)[:, None]
        self.k_first = k_start[None, :] + k_offset
        self.k_last = ((k_start + block_kv).clamp(max=kv_len) - 1)[None, :] + k_offset
        self.all_before = self.k_last <= self.q_first  # every key at or before every query
        self.all_after = self.k_first > self.q_last  # every key after every query


class _TokenSummary:
    """Per-block summaries of doc / group ids, each ``[B, nBlocks]`` int32.

    ``*_min`` is the least non-negative id of the block (INT32_MAX if none), ``*_max`` the greatest id,
    so a block with no real token has ``min > max`` and range-overlap tests need no emptiness check;
    ``*_key`` equals another block's key iff both blocks hold one and the same id >= 0 (see `_id_summary`).
    Group ids count only on real tokens (``doc >= 0``). The last block's tail repeats its last token,
    which changes no summary. Written as plain integer ops: ``torch.where`` / ``masked_fill`` are slow
    on the CPU at these sizes.
    """

    def __init__(self, doc: torch.Tensor, grp: torch.Tensor, block: int, side: int):
        batch, length = doc.shape
        n = -(-length // block)
        tail = n * block - length
        grp = grp | (doc >> 31)  # -1 wherever doc is padding (arithmetic shift of a negative int32)
        doc, grp = (torch.cat([x, x[:, -1:].expand(batch, tail)], 1).view(batch, n, block) for x in (doc, grp))
        self.doc_min, self.doc_max, self.doc_key = _id_summary(doc, side)
        self.grp_min, self.grp_max, self.grp_key = _id_summary(grp, side)


def _id_summary(ids: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Least non-negative id, greatest id, and a key that is the block's one id when all its ids are
    one value >= 0, else a negative number no other block's key equals (``side`` 0 for query blocks,
    1 for key blocks), so that one comparison of keys tells "both blocks are all this one id".

    ``ids & INT32_MAX`` turns -1 into INT32_MAX, above every real id (int32 throughout: int64
    reductions are several times slower on the CPU).
    """
    least = (ids & INT32_MAX).amin(-1)
    greatest = ids.amax(-1)
    single = (ids.amin(-1) == greatest) & (greatest >= 0)
    unique = -1 - side - 2 * torch.arange(ids.shape[1], dtype=torch.int32, device=ids.device)
    return least, greatest, torch.where(single, greatest, unique)


def classify_token_blocks(doc, grp, q_len, block_q, block_kv, window, window_covers_groups=False) -> torch.Tensor:
    """int8 block types ``[B, nQ, nK]`` of the token rule, from block summaries (nothing S x S).

    Args:
        doc, grp: int32 ``[B, kv_len]`` ids; q_len: the queries are the last ``q_len`` positions; block_q, block_kv:
            block sizes; window: None or > 0; window_covers_groups: whether the window cuts group pairs too
            (`omni_hf.mask.token_rule`).

    Sound: FULL and CAUSAL are claimed only where they hold for every in-range pair, MASKED only
    where no pair is allowed; the rest is PARTIAL and the kernel applies the token rule there.
    """
    kv_len = doc.shape[1]
    pos = BlockPositions(q_len, kv_len, block_q, block_kv, doc.device)
    qs = _TokenSummary(doc[:, kv_len - q_len:], grp[:, kv_len - q_len:], block_q, side=0)
    ks = _TokenSummary(doc, grp, block_kv, side=1)
    return _classify(qs, ks, pos, window, causal=True, window_covers_groups=window_covers_groups)


def classify_token_range_blocks(doc, grp, queries: tuple[int, int], keys: tuple[int, int], block_q, block_kv,
                                window) -> torch.Tensor:
    """int8 block types ``[B, nQ, nK]`` of the token rule for the queries at positions ``queries[0]:queries[1]`` of
    rows ``[B, S]`` over the keys at ``keys[0]:keys[1]`` (any two ranges). Sound as `classify_token_blocks`, but
    never CAUSAL: the kernels' CAUSAL and token-rule tests align queries bottom-right, which these need not be."""
    (q_start, q_stop), (k_start, k_stop) = queries, keys
    pos = BlockPositions(q_stop - q_start, k_stop - k_start, block_q, block_kv, doc.device, q_start, k_start)
    qs = _TokenSummary(doc[:, q_start:q_stop], grp[:, q_start:q_stop], block_q, side=0)
    ks = _TokenSummary(doc[:, k_start:k_stop], grp[:, k_start:k_stop], block_kv, side=1)
    return _classify(qs, ks, pos, window, causal=False)


def _classify(qs: _TokenSummary, ks: _TokenSummary, pos: BlockPositions, window, causal: bool,
              window_covers_groups: bool = False) -> torch.Tensor:
    """The block types of query and key block summaries at ``pos`` (CAUSAL claimed only where ``causal``; the window
    over group pairs too where ``window_covers_groups``)."""

    def q(name):
        return getattr(qs, name)[:, :, None]

    def k(name):
        return getattr(ks, name)[:, None, :]

    docs_overlap = (q("doc_min") <= k("doc_max")) & (k("doc_min") <= q("doc_max"))
    groups_overlap = (q("grp_min") <= k("grp_max")) & (k("grp_min") <= q("grp_max"))
    one_doc = q("doc_key") == k("doc_key")
    one_group = q("grp_key") == k("grp_key")
    if window is None:
        window_holds, window_fails = True, False
    else:
        window_holds = pos.q_last - pos.k_first < window  # every pair inside the window
        window_fails = pos.q_first - pos.k_last >= window  # no pair inside the window
    masked = ~docs_overlap | ((pos.all_after | window_fails) & ~groups_overlap)
    full = one_doc & ((pos.all_before & window_holds) | one_group)
    if window is not None and window_covers_groups:  # no pair of a group is seen outside the window either
        masked = masked | window_fails
        full = full & window_holds
    claim_causal = one_doc & window_holds & ~groups_overlap if causal else torch.zeros_like(full)
    return block_type(masked, full, claim_causal)


def token_range_patterns(doc, grp, tiles: torch.Tensor, queries: tuple[int, int], keys: tuple[int, int],
                         block_q: int, block_kv: int, window) -> torch.Tensor:
    """bool ``[n, block_q, block_kv]``: the token rule on each tile ``(b, q block, k block)`` of ``tiles`` (int64
    ``[n, 3]``) of the queries ``queries[0]:queries[1]`` over the keys ``keys[0]:keys[1]`` of rows ``[B, S]``; rows
    and columns past the ranges are False."""
    (q_start, q_stop), (k_start, k_stop) = queries, keys
    row = q_start + tiles[:, 1, None] * block_q + torch.arange(block_q, device=tiles.device)  # [n, block_q]
    col = k_start + tiles[:, 2, None] * block_kv + torch.arange(block_kv, device=tiles.device)  # [n, block_kv]
    valid = (row < q_stop)[:, :, None] & (col < k_stop)[:, None, :]
    batch = tiles[:, :1]
    q_doc, q_grp = (ids[batch, row.clamp(max=q_stop - 1)][:, :, None] for ids in (doc, grp))
    k_doc, k_grp = (ids[batch, col.clamp(max=k_stop - 1)][:, None, :] for ids in (doc, grp))
    back = row[:, :, None] - col[:, None, :]
    near = (back >= 0) if window is None else (back >= 0) & (back < window)
    return valid & (q_doc >= 0) & (q_doc == k_doc) & (near | ((q_grp >= 0) & (q_grp == k_grp)))


def implicit_block_table(kind: MaskKind, q_len: int, kv_len: int, block_q: int, block_kv: int,
                         window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """types int8 ``[1, 1, nQ, nK]`` and pool ids (all -1) of an implicit mask: the blocks the kernels derive
    (csrc/common/mask_rule.cuh, ``implicit_*``). FULL masks list every block as FULL; CAUSAL masks list the
    blocks between a row's first windowed key and its last query, FULL where every key precedes every query,
    PARTIAL (token rule, one document of text) where the window cuts the block, else CAUSAL."""
    pos = BlockPositions(q_len, kv_len, block_q, block_kv, torch.device("cpu"))
    if kind == MaskKind.FULL:
        types = torch.full((pos.q_first.shape[0], pos.k_first.shape[1]), FULL, dtype=torch.int8)
    else:
        listed, cut = pos.k_first <= pos.q_last, torch.zeros((), dtype=torch.bool)
        if window is not None:
            listed = listed & (pos.k_last >= pos.q_first - window + 1)
            cut = pos.q_last - pos.k_first >= window
        types = torch.where(cut, PARTIAL, torch.where(pos.k_last <= pos.q_first, FULL, CAUSAL))
        types = torch.where(listed, types, MASKED).to(torch.int8)
    return types[None, None], torch.full(types.shape, -1, dtype=torch.int32)[None, None]
