"""The token rule as one range of positions per row, where the ids allow it.

Under the token rule (`omni_hf.mask.token_rule`) a query at position ``p`` sees the keys of its document that precede it
(within the window) and every key of its group (image; with ``window_covers_groups``, those within the window). When
each document id and each group id covers one run of positions, and the ids of successive runs increase along the row
(as the collator and `token_ids_from_spans` number them), those keys are one range ``[first, last]``, and so are the
queries that see a key at ``p``. The CUDA kernels then test a row's range instead of comparing ids for every (query,
key) pair.

Everything here is O(S): a few scans along each row, no host sync, nothing ``S x S``.
"""

from __future__ import annotations

import torch

__all__ = ["RANGE_INEXACT", "token_ranges"]

RANGE_INEXACT = torch.iinfo(torch.int32).min  # `token_ranges` at every position of a row whose ids do not allow ranges


def token_ranges(doc_ids: torch.Tensor, group_ids: torch.Tensor, window: int | None,
                 window_covers_groups: bool = False) -> torch.Tensor:
    """Per position, the allowed range of keys as a query and of queries as a key.

    Args:
        doc_ids, group_ids: int32 ``[B, S]`` token-rule ids (-1: padding / text), as `OmniBlockMask` holds them.
        window: the sliding window, or None.
        window_covers_groups: whether the window cuts group pairs too (`omni_hf.mask.token_rule`); then a query sees
            the keys of its window and the rest of its group after it, and a key the queries of its window and those
            of its group before it: still one range each.
    Returns:
        int32 ``[B, S, 4]`` on the ids' device: ``(first key, last key, first query, last query)`` that the
        token rule allows for position ``p`` as a query and as a key. Padding positions hold the empty range
        ``(0, -1, 0, -1)``. Every position of a row whose ids do not each form one run, increasing along the
        row, holds `RANGE_INEXACT` (the kernels compare ids there).
    """
    batch, length = doc_ids.shape
    pos = torch.arange(length, dtype=torch.int32, device=doc_ids.device).expand(batch, length)
    real = doc_ids >= 0
    grp = torch.where(real, group_ids, -1)  # groups count only on real tokens
    doc_starts = _run_starts(doc_ids)
    grp_starts = doc_starts | _run_starts(grp)  # a group never continues into the next document
    exact = _increasing(doc_ids, doc_starts & real) & _increasing(grp, grp_starts & (grp >= 0))
    doc_first, doc_last = _run_bounds(doc_starts, pos)
    grp_first, grp_last = (torch.where(grp >= 0, bound, pos) for bound in _run_bounds(grp_starts, pos))
    if window is None:
        causal_first, causal_last = doc_first, doc_last
    else:
        reach = min(window - 1, length)  # keeps int32 positions from overflowing
        causal_first = torch.maximum(doc_first, pos - reach)
        causal_last = torch.minimum(doc_last, pos + reach)
    if not window_covers_groups:  # a group is seen whole (without a window the causal part covers it anyway)
        causal_first, causal_last = torch.minimum(causal_first, grp_first), torch.maximum(causal_last, grp_last)
    key_first = torch.where(real, causal_first, 0)  # padding: the empty range (0, -1)
    key_last = torch.where(real, torch.maximum(pos, grp_last), -1)
    query_first = torch.where(real, torch.minimum(pos, grp_first), 0)
    query_last = torch.where(real, causal_last, -1)
    ranges = torch.stack([key_first, key_last, query_first, query_last], dim=-1)
    return torch.where(exact[:, None, None], ranges, RANGE_INEXACT).to(torch.int32).contiguous()


def _run_starts(ids: torch.Tensor) -> torch.Tensor:
    """bool ``[B, S]``: True where a run of equal ids begins (always at position 0)."""
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return starts


def _increasing(ids: torch.Tensor, counted_starts: torch.Tensor) -> torch.Tensor:
    """bool ``[B]``: every counted run's id exceeds every id before it in the row (so no id has two runs)."""
    before = torch.cummax(ids, dim=1).values
    before = torch.cat([torch.full_like(before[:, :1], -1), before[:, :-1]], dim=1)
    return ~(counted_starts & (before >= ids)).any(dim=1)


def _run_bounds(starts: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 ``[B, S]`` first and last position of the run holding each position."""
    first = torch.cummax(torch.where(starts, pos, 0), dim=1).values
    ends = torch.ones_like(starts)
    ends[:, :-1] = starts[:, 1:]
    last_reversed = torch.cummin(torch.where(ends, pos, pos.shape[1] - 1).flip(1), dim=1).values
    return first, last_reversed.flip(1)
