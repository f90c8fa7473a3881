"""The mask spec: what a model's mask creation hands its attention layers under "omni" (`omni_mask`, registered in
Transformers' `AttentionMaskInterface`). A spec holds sizes, offsets, the 2D padding mask and Transformers' mask
function, never a dense mask; `layer_mask` turns it into an `OmniBlockMask` (reading the function with
`recognition`), and the attention function keeps what it builds in the spec's per-forward cache, `built`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from transformers.masking_utils import causal_mask_function

__all__ = ["OmniMaskSpec", "key_slice", "omni_mask"]


@dataclasses.dataclass(eq=False)
class OmniMaskSpec:
    """What a model's mask creation hands its attention layers under "omni".

    Query row ``i`` is at absolute position ``q_offset + i``, key ``j`` at ``kv_offset + j``; the pair is allowed
    where ``mask_function(b, h, q_pos, kv_pos)`` and ``padding_mask[b, j]`` allow it.

    Attributes:
        batch_size, q_len, kv_len: sizes of the attention call.
        q_offset: int, or a 0-d int tensor (static caches), a snapshot taken when the spec was made.
        kv_offset: int.
        mask_function: Transformers' mask function over absolute positions.
        padding_mask: bool ``[B, kv_len]`` (True = a real token) or None.
        window: ``local_size`` of the mask creator (sliding window or chunk size), or None.
        plain_causal: True when a causal mask creator composed ``mask_function`` from its own parts only
            (no model-supplied or/and functions), so an `and_masks` is packing, a sliding window or chunks.
        all_keys_real: True when a padding mask covered every key and held no padding, and was dropped for that
            (``padding_mask`` None): every key is a real token, whatever the offsets say (cross-attention).
        built: the per-forward cache of the attention function (`attention._prepared_call`): the layers' block
            masks and prepared calls, filled by the first layer that needs each.
    """

    batch_size: int
    q_len: int
    kv_len: int
    q_offset: int | torch.Tensor
    kv_offset: int
    mask_function: Callable
    padding_mask: torch.Tensor | None
    window: int | None
    plain_causal: bool
    all_keys_real: bool = False
    built: dict = dataclasses.field(default_factory=dict)

    # What Transformers touches on a prepared mask: generate() prepares masks for compilable caches (5.23 calls
    # `contiguous()` on them), then the model's mask creators read `ndim` / `shape` and hand the spec back to
    # `omni_mask`, which returns it unchanged.
    ndim = 4

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.batch_size, 1, self.q_len, self.kv_len

    def contiguous(self) -> OmniMaskSpec:
        return self


def omni_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    use_vmap: bool = False,
    **kwargs,
) -> OmniMaskSpec:
    """Transformers' mask function for "omni" (same arguments as `transformers.masking_utils.sdpa_mask`).

    Args:
        attention_mask: the 2D padding mask ``[B, >= kv_offset + kv_length]``, None, or a spec already made.
        use_vmap: True when the model composed its own or/and mask functions into ``mask_function``.
        kwargs: the other creator arguments; bidirectional creators pass ``allow_is_bidirectional_skip``.
    Returns:
        An `OmniMaskSpec`; no tensor of size ``q_length x kv_length`` is made.
    """
    if isinstance(attention_mask, OmniMaskSpec):  # prepared by generate() for this forward
        return attention_mask
    if isinstance(q_offset, torch.Tensor):
        q_offset = q_offset.clone()  # a static cache advances its tensor in place before the layers attend
    padding = None if attention_mask is None else key_slice(attention_mask.bool(), kv_offset, kv_length, fill=False)
    all_keys_real = padding is not None and _may_sync(q_offset, kv_offset) and bool(padding.all())
    if all_keys_real:
        padding = None  # unpadded: one host sync, as sdpa's, keeps the mask implicit
    plain_causal = not use_vmap and "allow_is_bidirectional_skip" not in kwargs
    return OmniMaskSpec(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, padding, local_size,
                        plain_causal, all_keys_real)


def _may_sync(q_offset: int | torch.Tensor, kv_offset: int) -> bool:
    """Whether the call may sync to drop an all-ones padding mask, as sdpa's mask does: an eager call (no static
    cache's tensor offset, not compiling) that decodes (queries after position 0: the loop syncs every step anyway)
    or runs without autograd (a prompt's prefill, an evaluation loop); not a training forward."""
    if not isinstance(q_offset, int) or torch.compiler.is_compiling():
        return False
    return q_offset + kv_offset > 0 or not torch.is_grad_enabled()


def key_slice(ids: torch.Tensor, kv_offset: int, kv_len: int, fill) -> torch.Tensor:
    """Columns ``kv_offset : kv_offset + kv_len`` of per-position ``ids [B, L]``, padded with ``fill`` past ``L``."""
    end = kv_offset + kv_len
    if end > ids.shape[-1]:
        ids = torch.nn.functional.pad(ids, (0, end - ids.shape[-1]), value=fill)
    return ids[:, kv_offset:end]
