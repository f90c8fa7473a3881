"""The token rule, element by element: the one Python statement of it (the kernels state it in
``csrc/common/mask_rule.cuh``).

With per-token ids ``doc`` (the packed sample, -1 = padding) and ``grp`` (the bidirectional group, e.g. an image;
-1 = causal text), a query at absolute position ``p`` sees key ``j`` iff

    doc[p] >= 0 and doc[p] == doc[j] and ((j <= p and p - j < window) or (grp[p] >= 0 and grp[p] == grp[j]))

(no window: ``p - j < window`` always holds). The window cuts the causal part only: a group is seen whole, however
long. With ``window_covers_groups`` it cuts the whole rule, group pairs too, as Transformers' sliding layers of
Gemma 3 and Gemma 4 do (``and_masks(or_masks(causal, blockwise), sliding_window_overlay(window))``):

    doc[p] >= 0 and doc[p] == doc[j] and p - j < window and (j <= p or (grp[p] >= 0 and grp[p] == grp[j]))

(keys after ``p`` are never cut, as ``p - j < 0``). The two agree wherever no group spans ``window`` positions or more.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["MaskMod", "token_mask_mod"]

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def token_mask_mod(doc_ids: torch.Tensor, group_ids: torch.Tensor | None = None, window: int | None = None,
                   window_covers_groups: bool = False) -> MaskMod:
    """The token rule as a FlexAttention-style ``mask_mod(b, h, q_pos, kv_pos) -> bool``.

    Args:
        doc_ids: int ``[B|1, S]``: the packed sample of each position, -1 = padding.
        group_ids: int ``[B|1, S]`` or None (all text): the bidirectional group of each position, -1 = text.
        window: sliding window, or None.
        window_covers_groups: False: the window cuts the causal part only; True: it cuts group pairs too.
    Returns:
        ``mask_mod`` over broadcastable int index tensors: ``b`` the batch row (clamped to 0 where the ids
        broadcast), ``q_pos`` and ``kv_pos`` absolute positions in ``[0, S)`` (a query row ``i`` of ``q_len``
        rows over ``S`` keys is at ``i + S - q_len``); ``h`` is unused. With equal query and key lengths, as
        FlexAttention's ``create_block_mask`` calls it, positions are its indices.
    """
    def mask_mod(b, h, q_pos, kv_pos):
        doc_row = b * (doc_ids.shape[0] > 1)
        q_doc = doc_ids[doc_row, q_pos]
        allowed = (q_doc >= 0) & (q_doc == doc_ids[doc_row, kv_pos])
        near = kv_pos <= q_pos
        if window is not None:
            in_window = q_pos - kv_pos < window
            allowed, near = (allowed & in_window, near) if window_covers_groups else (allowed, near & in_window)
        if group_ids is None:
            return allowed & near
        group_row = b * (group_ids.shape[0] > 1)
        q_group = group_ids[group_row, q_pos]
        return allowed & (near | ((q_group >= 0) & (q_group == group_ids[group_row, kv_pos])))

    return mask_mod
