"""The collator's interleaved mask for Transformers' other attention backends, to run one batch on each of them.

``omni`` reads the collator's ``omni_doc_ids`` / ``omni_group_ids`` as they are. For the other backends this module
builds what a user would otherwise write by hand from the same ids, by the token rule (`omni_hf.mask.token_mask_mod`):
a dense ``[B, 1, L, L]`` mask for ``sdpa`` (bool) and ``eager`` (additive float), a FlexAttention ``BlockMask`` for
``flex_attention``. ``mask="causal"`` drops the image groups (every token causal, packed samples still isolated):
the same run without bidirectional images.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...mask import token_mask_mod

__all__ = ["BACKENDS", "MASKS", "attention_kwargs", "dense_mask"]

BACKENDS = ("omni", "sdpa", "flex_attention", "eager")
MASKS = ("interleaved", "causal")


def attention_kwargs(batch: Mapping[str, torch.Tensor], attn: str, mask: str) -> dict[str, object]:
    """The LM keyword arguments (positions and mask) for the collator's ``batch`` under backend ``attn`` (one of
    `BACKENDS`) and ``mask`` (one of `MASKS`)."""
    doc = batch["omni_doc_ids"]
    group = batch["omni_group_ids"] if mask == "interleaved" else torch.full_like(doc, -1)
    kwargs: dict[str, object] = {"position_ids": batch["position_ids"]}
    if attn == "omni":
        return kwargs | {"omni_doc_ids": doc, "omni_group_ids": group}
    if attn == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        length = doc.shape[1]
        return kwargs | {"attention_mask": create_block_mask(token_mask_mod(doc, group), doc.shape[0], None, length,
                                                             length, device=doc.device)}
    allowed = dense_mask(doc, group)
    if attn == "sdpa":
        return kwargs | {"attention_mask": allowed}
    if attn == "eager":
        blocked = torch.finfo(torch.float32).min
        return kwargs | {"attention_mask": torch.zeros(allowed.shape, device=doc.device).masked_fill(~allowed, blocked)}
    raise ValueError(f"attn: expected one of {BACKENDS}, got {attn!r}")


def dense_mask(doc: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """bool ``[B, 1, L, L]`` (True = attend) of the token rule over int ``[B, L]`` ids. A padding query, which sees
    nothing under the rule, sees itself, so that no row is empty (an empty row is NaN in SDPA; padding outputs are
    unused)."""
    batch, length = doc.shape
    b = torch.arange(batch, device=doc.device)[:, None, None]
    q = torch.arange(length, device=doc.device)[None, :, None]
    k = torch.arange(length, device=doc.device)[None, None, :]
    allowed = token_mask_mod(doc, group)(b, 0, q, k) | ((q == k) & (doc[:, :, None] < 0))
    return allowed[:, None]
