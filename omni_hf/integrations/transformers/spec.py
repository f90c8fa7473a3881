"""The mask spec: what a model's mask creation hands its attention layers under "omni" (`omni_mask`, registered in
Transformers' `AttentionMaskInterface`), and the `OmniBlockMask` a spec becomes (`block_mask_from_spec`): implicit
where sizes describe it, the token rule where `recognition` reads the mask function, else tile by tile."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

from ...mask import OmniBlockMask
from .recognition import key_slice, sliding_window, token_rule_parts

__all__ = ["OmniMaskSpec", "block_mask_from_spec", "omni_mask"]


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
        built: per-forward cache of built masks, filled by the first layer.
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
    if padding is not None and _may_sync(q_offset, kv_offset) and bool(padding.all()):
        padding = None  # unpadded: one host sync, as sdpa's, keeps the mask implicit
    plain_causal = not use_vmap and "allow_is_bidirectional_skip" not in kwargs
    return OmniMaskSpec(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, padding, local_size,
                        plain_causal)


def block_mask_from_spec(spec: OmniMaskSpec, device, cu_seq_lens_k) -> tuple[OmniBlockMask, torch.Tensor | None]:
    """The spec's block mask (token rule where its function is recognised, else tile by tile) and key order."""
    segments = None if cu_seq_lens_k is None else cu_segments(cu_seq_lens_k, spec.batch_size, spec.q_len,
                                                                spec.kv_len, device)
    if segments is None and (implicit := _implicit_mask(spec)) is not None:
        return implicit, None
    rule = token_rule_parts(spec, device)
    if rule is None:
        return _tile_by_tile(spec, device, segments), None
    starts, groups, window = rule
    position = torch.arange(spec.kv_len, device=device) + spec.kv_offset
    valid = (position < spec.q_offset + spec.q_len)[None]  # unfilled static-cache slots are not keys
    if spec.padding_mask is not None:
        valid = valid & spec.padding_mask
    if segments is not None:
        starts, valid = starts | (segments != segments.roll(1, -1)), valid & (segments >= 0)
    doc = torch.where(valid, starts.cumsum(-1, dtype=torch.int32) - 1, -1)
    grp = None if groups is None else torch.where(valid, groups, -1)
    order = _key_order(spec, device)
    if order is not None:
        doc, grp = doc[:, order], None if grp is None else grp[:, order]
    return OmniBlockMask.from_token_ids(doc, grp, q_len=spec.q_len, window=window), order


def _implicit_mask(spec: OmniMaskSpec) -> OmniBlockMask | None:
    """The spec's mask without token ids where it needs none: plain causal or sliding-window attention over keys
    that are all real and bottom-right aligned (implicit), or bidirectional attention over keys that all hold
    something (implicit when all are real, else `OmniBlockMask.from_key_padding`: query rows are never masked,
    which cross-attention needs); else None."""
    filled = spec.q_offset + spec.q_len - spec.kv_offset
    if not isinstance(filled, int) or filled != spec.kv_len:
        return None
    if spec.mask_function is bidirectional_mask_function:
        if spec.padding_mask is None:
            return OmniBlockMask.full(spec.q_len, spec.kv_len)
        return OmniBlockMask.from_key_padding(spec.padding_mask, spec.q_len)
    if spec.padding_mask is not None:
        return None
    if spec.mask_function is causal_mask_function:
        return OmniBlockMask.causal(spec.q_len, spec.kv_len)
    window = sliding_window(spec.mask_function)
    return None if window is None else OmniBlockMask.causal(spec.q_len, spec.kv_len, window=window)


def _may_sync(q_offset: int | torch.Tensor, kv_offset: int) -> bool:
    """Whether the call may sync to drop an all-ones padding mask, as sdpa's mask does: an eager call (no static
    cache's tensor offset, not compiling) that decodes (queries after position 0: the loop syncs every step anyway)
    or runs without autograd (a prompt's prefill, an evaluation loop); not a training forward."""
    if not isinstance(q_offset, int) or torch.compiler.is_compiling():
        return False
    return q_offset + kv_offset > 0 or not torch.is_grad_enabled()


def _key_order(spec: OmniMaskSpec, device) -> torch.Tensor | None:
    """Key order that makes the filled slots of a static cache end the buffer, as bottom-right alignment needs
    (slot ``(j + filled) % kv_len`` becomes key ``j``); None when they already do."""
    filled = spec.q_offset + spec.q_len - spec.kv_offset
    if isinstance(filled, int) and filled == spec.kv_len:
        return None
    return (torch.arange(spec.kv_len, device=device) + filled) % spec.kv_len


def cu_segments(cu_seq_lens_k: torch.Tensor, batch: int, q_len: int, kv_len: int, device) -> torch.Tensor:
    """The packed sequence of each key from ``cu_seq_lens_k``, -1 past the last one: int ``[1, kv_len]``."""
    if batch != 1 or q_len != kv_len:
        raise ValueError(f"cu_seq_lens_k: expected a flattened batch of one row and no cache, got batch {batch}, "
                         f"q_len {q_len}, kv_len {kv_len}")
    bounds = cu_seq_lens_k.to(device)
    position = torch.arange(kv_len, device=device, dtype=bounds.dtype)
    return torch.where(position < bounds[-1], torch.searchsorted(bounds, position, right=True) - 1, -1)[None]


def _tile_by_tile(spec: OmniMaskSpec, device, segments: torch.Tensor | None) -> OmniBlockMask:
    """The spec's exact mask, its function evaluated a few tile rows at a time (syncs with the device)."""
    def mask_mod(b, h, q, kv):
        allowed = spec.mask_function(b, h, q + spec.q_offset, kv + spec.kv_offset)
        if spec.padding_mask is not None:
            allowed = allowed & spec.padding_mask[b, kv]
        if segments is not None:
            allowed = allowed & (segments[0, q] == segments[0, kv]) & (segments[0, kv] >= 0)
        return allowed

    return OmniBlockMask.from_mask_fn(mask_mod, spec.q_len, spec.kv_len, batch=spec.batch_size, device=device)
