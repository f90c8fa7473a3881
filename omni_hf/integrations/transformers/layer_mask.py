"""The block mask of one attention call: from what the call carries to the `OmniBlockMask` it attends with.

`layer_mask` picks the mask, first match wins:

1. a packed call (no mask, ``cu_seq_lens_k``: a packed vision tower, `packed_towers`) attends each sequence alone,
   causal or bidirectional, by the token rule; an encoder call (no mask, ``is_causal`` False: a vision tower)
   attends bidirectionally (implicit); a call with a float mask (an additive mask a model makes itself, as
   Pixtral's tower under Transformers 5.9: 0 where allowed, the dtype's minimum elsewhere) attends every key
   (implicit), the mask joining the scores as the op's ``bias`` (`attention`), as eager adds it. Such calls run so
   even when 2. or 3. are given: those describe the language model's tokens (Qwen2-VL hands its vision tower the
   forward's kwargs);
2. an `OmniBlockMask` as the layer's mask (a prepared mask per layer type, handed over as Transformers takes them:
   ``attention_mask={"full_attention": ..., "sliding_attention": ...}``, as Flex takes its ``BlockMask``), then an
   ``omni_block_mask`` kwarg (one for every layer), as is;
3. ``omni_doc_ids`` / ``omni_group_ids`` kwargs (the collator's token ids, ``[B, kv_len]``), with the layer's
   sliding window on the causal part; without the image groups in a layer its model keeps images causal in
   (`images_causal_in_layer`: Gemma 4's global layers);
4. the `OmniMaskSpec` (`block_mask_from_spec`). Plain causal, sliding-window and bidirectional attention over
   unpadded, bottom-right aligned keys become implicit masks (`OmniBlockMask.causal` / `full`: nothing is built);
   bidirectional attention over padded keys (encoders, cross-attention) becomes `OmniBlockMask.from_key_padding`.
   Mask functions `recognition` reads become the token rule (`OmniBlockMask.from_token_ids`: vectorised, on the
   GPU, no host sync); ``cu_seq_lens_k`` (DataCollatorWithFlattening) adds document starts. Anything else is
   evaluated tile by tile (`OmniBlockMask.from_mask_fn`: exact, but it syncs and breaks a compiled graph);
5. no mask at all: causal (implicit, with the layer's window); a bool ``[B|1, H|1, Sq, Skv]`` tensor: as dense.

Positions are bottom-right aligned (query ``i`` at ``i + kv_len - q_len``). Static caches hand over their whole
buffer, so their keys are rotated to end at the last filled slot (the key order returned beside the mask), and
unfilled slots are masked.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

from ...mask import OmniBlockMask
from ...mask.validation import check_ids_from_minus_one, describe_value
from .model_support import images_causal_in_layer
from .recognition import sliding_window, token_rule_parts
from .spec import OmniMaskSpec

__all__ = ["block_mask_from_spec", "layer_mask", "shared_mask_source"]


def shared_mask_source(mask, sliding_window: int | None, kwargs: dict):
    """Which of the forward's shared inputs `layer_mask` reads for a call that carries the forward's spec: "block"
    (an ``omni_block_mask``), ("ids", window) (the collator's ids, windowed per layer) or "spec"; layers of one
    forward with equal sources and sizes share one mask. None where the call carries no spec (nothing is shared:
    packed and encoder calls, which carry none, build theirs per call, and cheaply)."""
    if type(mask) is not OmniMaskSpec:
        return None
    if kwargs.get("omni_block_mask") is not None:
        return "block"
    if kwargs.get("omni_doc_ids") is not None or kwargs.get("omni_group_ids") is not None:
        return "ids", sliding_window
    return "spec"


def layer_mask(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, mask, sliding_window: int | None,
               is_causal: bool | None, kwargs: dict) -> tuple[OmniBlockMask, torch.Tensor | None]:
    """The call's block mask and, for a static cache, the key order it assumes (see the module docstring).

    Args:
        query: ``[B, Hq, Sq, D]``; key: ``[B, Hkv, Skv, D]`` (only sizes and device are read).
        mask: the layer's `OmniMaskSpec`, an `OmniBlockMask`, None, or a bool or float (additive)
            ``[B|1, H|1, Sq, Skv]`` tensor.
        sliding_window: the layer's window; is_causal: for a missing mask (default ``module.is_causal``, else True).
        kwargs: the attention function's keyword arguments.
    Returns:
        The `OmniBlockMask` and int64 ``[Skv]`` key order, or None when the keys are in order.
    """
    batch, q_len, kv_len, device = query.shape[0], query.shape[2], key.shape[2], query.device
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if mask is None and (bounds := kwargs.get("cu_seq_lens_k")) is not None:  # a packed call (packed_towers.py)
        doc = _cu_segments(bounds, batch, q_len, kv_len, device)  # each sequence alone: an image, a window
        groups = None if causal else torch.zeros_like(doc)  # bidirectional: each sequence one group
        return OmniBlockMask.from_token_ids(doc, groups, window=sliding_window), None
    if mask is None and not causal:  # an encoder call (a VLM's vision tower): the collator's kwargs describe the LM
        return OmniBlockMask.full(q_len, kv_len), None
    if isinstance(mask, torch.Tensor) and mask.is_floating_point():  # additive: the op's bias (attention.py)
        return OmniBlockMask.full(q_len, kv_len), None
    if isinstance(mask, OmniBlockMask):  # prepared for this layer's type
        _check_block_mask("attention_mask", mask, batch, q_len, kv_len)
        return mask.to(device, non_blocking=True), None
    if (block_mask := kwargs.get("omni_block_mask")) is not None:
        _check_block_mask("omni_block_mask", block_mask, batch, q_len, kv_len)
        return block_mask.to(device, non_blocking=True), None
    if kwargs.get("omni_doc_ids") is not None or kwargs.get("omni_group_ids") is not None:
        doc, grp = (_token_ids_kwarg(name, kwargs.get(name), minus_one, batch, kv_len, device)
                    for name, minus_one in (("omni_doc_ids", "padding"), ("omni_group_ids", "causal text")))
        doc = doc if doc is not None else torch.zeros_like(grp)
        grp = None if images_causal_in_layer(module, sliding_window) else grp
        return OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, window=sliding_window), None
    if isinstance(mask, OmniMaskSpec):
        return block_mask_from_spec(mask, device, kwargs.get("cu_seq_lens_k"))
    if mask is None:
        return OmniBlockMask.causal(q_len, kv_len, window=sliding_window), None  # implicit: nothing built
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        return OmniBlockMask.from_dense(mask.to(device)), None
    raise TypeError(f"attention_mask: expected an OmniMaskSpec (made by the 'omni' mask function), an OmniBlockMask, "
                    f"None, or a bool or float (additive) [B, H, q_len, kv_len] tensor, got {type(mask).__name__} "
                    f"{getattr(mask, 'dtype', '')}")


def _token_ids_kwarg(name: str, ids, minus_one: str, batch: int, kv_len: int, device) -> torch.Tensor | None:
    """The kwarg ``name`` (``omni_doc_ids`` / ``omni_group_ids``) as int ids ``[B|1, kv_len]`` on ``device``, or None.

    A list (or numpy array) is converted to a tensor. Errors name the kwarg, what was expected and what was received;
    ids below -1 are refused where they are still on the CPU (`omni_hf.mask.validation.check_ids_from_minus_one`).
    """
    if ids is None:
        return None
    if isinstance(ids, (list, tuple, np.ndarray)):
        ids = torch.as_tensor(np.asarray(ids))
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype.is_complex \
            or ids.dtype is torch.bool:
        raise TypeError(f"{name}: expected integer ids [B, kv_len] (a tensor, or a list converted to one), got "
                        f"{describe_value(ids)}")
    ids = ids[None] if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[1] != kv_len:
        raise ValueError(f"{name}: expected one id per key, shape [B, kv_len={kv_len}] (the tokens of input_ids and "
                         f"any cached before them), got shape {list(ids.shape)}")
    if ids.shape[0] not in (1, batch):
        raise ValueError(f"{name}: expected batch 1 or {batch} (that of input_ids), got shape {list(ids.shape)}")
    check_ids_from_minus_one(name, ids, minus_one)
    return ids.to(device, non_blocking=True)


def _check_block_mask(name: str, block_mask, batch: int, q_len: int, kv_len: int) -> None:
    """``name`` (the ``omni_block_mask`` kwarg, or a layer's ``attention_mask``) must be an `OmniBlockMask` for this
    call's sizes; errors name it."""
    if not isinstance(block_mask, OmniBlockMask):
        raise TypeError(f"{name}: expected an OmniBlockMask, got {type(block_mask).__name__}")
    if (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
        raise ValueError(f"{name}: expected q_len={q_len}, kv_len={kv_len} (the tokens of input_ids and any "
                         f"cached before them), got q_len={block_mask.q_len}, kv_len={block_mask.kv_len}")
    if block_mask.batch not in (1, batch):
        raise ValueError(f"{name}: expected batch 1 or {batch} (that of input_ids), got {block_mask.batch}")


def block_mask_from_spec(spec: OmniMaskSpec, device, cu_seq_lens_k) -> tuple[OmniBlockMask, torch.Tensor | None]:
    """The spec's block mask (token rule where its function is recognised, else tile by tile) and key order."""
    segments = None if cu_seq_lens_k is None else _cu_segments(cu_seq_lens_k, spec.batch_size, spec.q_len,
                                                                spec.kv_len, device)
    if segments is None and (implicit := _implicit_mask(spec)) is not None:
        return implicit, None
    rule = token_rule_parts(spec, device)
    if rule is None:
        return _tile_by_tile(spec, device, segments), None
    starts, groups = rule.starts, rule.groups
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
    return OmniBlockMask.from_token_ids(doc, grp, q_len=spec.q_len, window=rule.window,
                                        window_covers_groups=rule.window_covers_groups), order


def _implicit_mask(spec: OmniMaskSpec) -> OmniBlockMask | None:
    """The spec's mask without token ids where it needs none: plain causal or sliding-window attention over keys
    that are all real and bottom-right aligned (implicit), or bidirectional attention over keys that all hold
    something (implicit when all are real, else `OmniBlockMask.from_key_padding`: query rows are never masked,
    which cross-attention needs); else None. Bidirectional keys all hold something where they end at the last
    query, and also where the padding mask covers every key (cross-attention over a padded encoder: Molmo2's
    pooling, one query over a few patches; Bart's decoder), also when it was dropped for holding no padding
    (``all_keys_real``: inference over full pooling windows): a bidirectional mask does not read positions."""
    filled = spec.q_offset + spec.q_len - spec.kv_offset
    aligned = isinstance(filled, int) and filled == spec.kv_len
    if spec.mask_function is bidirectional_mask_function:
        if spec.padding_mask is not None:
            return OmniBlockMask.from_key_padding(spec.padding_mask, spec.q_len)
        return OmniBlockMask.full(spec.q_len, spec.kv_len) if aligned or spec.all_keys_real else None
    if not aligned:
        return None
    if spec.padding_mask is not None:
        return None
    if spec.mask_function is causal_mask_function:
        return OmniBlockMask.causal(spec.q_len, spec.kv_len)
    window = sliding_window(spec.mask_function)
    return None if window is None else OmniBlockMask.causal(spec.q_len, spec.kv_len, window=window)


def _key_order(spec: OmniMaskSpec, device) -> torch.Tensor | None:
    """Key order that makes the filled slots of a static cache end the buffer, as bottom-right alignment needs
    (slot ``(j + filled) % kv_len`` becomes key ``j``); None when they already do."""
    filled = spec.q_offset + spec.q_len - spec.kv_offset
    if isinstance(filled, int) and filled == spec.kv_len:
        return None
    return (torch.arange(spec.kv_len, device=device) + filled) % spec.kv_len


def _cu_segments(cu_seq_lens_k: torch.Tensor, batch: int, q_len: int, kv_len: int, device) -> torch.Tensor:
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
