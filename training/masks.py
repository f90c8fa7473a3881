"""What each attention backend needs to see the collator's interleaved mask.

``omni`` reads the collator's ``omni_doc_ids`` / ``omni_group_ids`` as they are. For the other backends
this module builds what a user would otherwise write by hand from the same ids: a dense ``[B, 1, L, L]``
mask for ``sdpa`` (bool) and ``eager`` (additive float), a FlexAttention ``BlockMask`` for
``flex_attention``. ``mask="causal"`` drops the image groups (every token causal, packed samples still
isolated): the same run without bidirectional images.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

BACKENDS = ("omni", "sdpa", "flex_attention", "eager")
MASKS = ("interleaved", "causal")

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attention_kwargs(batch: Mapping[str, torch.Tensor], attn: str, mask: str) -> dict[str, object]:
    """The LM keyword arguments (positions and mask) for ``batch`` under backend ``attn`` and ``mask``."""
    doc = batch["omni_doc_ids"]
    group = batch["omni_group_ids"] if mask == "interleaved" else torch.full_like(doc, -1)
    kwargs: dict[str, object] = {"position_ids": batch["position_ids"]}
    if attn == "omni":
        return kwargs | {"omni_doc_ids": doc, "omni_group_ids": group}
    if attn == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        length = doc.shape[1]
        return kwargs | {"attention_mask": create_block_mask(token_rule(doc, group), doc.shape[0], None, length,
                                                             length, device=doc.device)}
    allowed = dense_mask(doc, group)
    if attn == "sdpa":
        return kwargs | {"attention_mask": allowed}
    if attn == "eager":
        blocked = torch.finfo(torch.float32).min
        return kwargs | {"attention_mask": torch.zeros(allowed.shape, device=doc.device).masked_fill(~allowed, blocked)}
    raise ValueError(f"attn: expected one of {BACKENDS}, got {attn!r}")


def token_rule(doc: torch.Tensor, group: torch.Tensor) -> MaskMod:
    """FlexAttention-style ``mask_mod`` of the omni token rule over int ``[B, L]`` ids: query ``q`` sees key
    ``k`` of its own sample (``doc >= 0``) if ``k <= q`` or both lie in the same image (``group >= 0``)."""

    def mask_mod(b, h, q, k):
        same_doc = (doc[b, q] >= 0) & (doc[b, q] == doc[b, k])
        same_group = (group[b, q] >= 0) & (group[b, q] == group[b, k])
        return same_doc & ((k <= q) | same_group)

    return mask_mod


def dense_mask(doc: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """bool ``[B, 1, L, L]`` (True = attend) of `token_rule`. A padding query, which sees nothing under the
    rule, sees itself, so that no row is empty (an empty row is NaN in SDPA; padding outputs are unused)."""
    batch, length = doc.shape
    b = torch.arange(batch, device=doc.device)[:, None, None]
    q = torch.arange(length, device=doc.device)[None, :, None]
    k = torch.arange(length, device=doc.device)[None, None, :]
    allowed = token_rule(doc, group)(b, 0, q, k) | ((q == k) & (doc[:, :, None] < 0))
    return allowed[:, None]
