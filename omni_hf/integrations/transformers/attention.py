"""``attn_implementation="omni"`` for Hugging Face Transformers.

`register` adds "omni" to Transformers' `AttentionInterface` and `AttentionMaskInterface`. The mask function,
`omni_mask`, runs where a model creates its masks and returns an `OmniMaskSpec` (sizes, offsets, the 2D
padding mask and Transformers' mask function), never a dense mask. Every layer receives that spec; the first
one builds the `OmniBlockMask` and caches it there with the call prepared for it (`omni_hf.ops.attention.prepare_call`:
checks and backend), so both happen once per forward.

`omni_attention_forward` picks its mask, first match wins:

1. an ``omni_block_mask`` kwarg (an `OmniBlockMask`), as is;
2. ``omni_doc_ids`` / ``omni_group_ids`` kwargs (the collator's token ids, ``[B, kv_len]``), with the layer's
   sliding window on the causal part;
3. the spec. Plain causal, sliding-window and bidirectional attention over unpadded, bottom-right aligned keys
   become implicit masks (`OmniBlockMask.causal` / `full`: nothing is built; during generation and in forwards
   without autograd an all-ones padding mask counts as none, at one host sync as with sdpa); bidirectional
   attention over padded keys (encoders, cross-attention) becomes `OmniBlockMask.from_key_padding`. Other
   recognised mask functions become the token rule (`OmniBlockMask.from_token_ids`: vectorised, on the GPU, no
   host sync): causal ones with padding and caches, bidirectional ones packed by ``cu_seq_lens_k``; Transformers' own
   compositions of causal with packing (``position_ids`` that restart), sliding windows and chunks, whose
   document starts are read by evaluating the function on neighbouring positions; and causal with image
   blocks (``block_sequence_ids`` from ``token_type_ids``). ``cu_seq_lens_k`` (DataCollatorWithFlattening)
   adds document starts. Anything else is evaluated tile by tile (`OmniBlockMask.from_mask_fn`: exact, but
   it syncs and breaks a compiled graph);
4. no mask: causal, or bidirectional when ``is_causal`` is False (vision towers), both implicit; a packed call
   (``cu_seq_lens_k``: a packed vision tower, `packed_towers`) attends each sequence alone, causal or bidirectional,
   by the token rule. Such calls run so even when 1. or 2. are given: those describe the language model's tokens
   (Qwen2-VL hands its vision tower the forward's kwargs).

Positions are bottom-right aligned (query ``i`` at ``i + kv_len - q_len``). Static caches hand over their whole
buffer, so their keys are rotated to end at the last filled slot, and unfilled slots are masked. Under the token
rule (causal-family masks with padding, packing, image blocks) rows of padding tokens output zeros; bidirectional
masks never mask a query row (a cross-attention query is not one of the keys), and masks evaluated tile by tile
give those rows what the mask function gives. Transformers leaves rows of padding tokens arbitrary.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from transformers.utils import logging

from ...mask import OmniBlockMask
from ...mask.validation import check_ids_from_minus_one, describe_value
from ...ops.attention import PreparedCall, cast_for_autocast, prepare_call, run_call
from .model_support import UNSUPPORTED_FEATURES
from .spec import OmniMaskSpec, block_mask_from_spec, cu_segments

__all__ = ["omni_attention_forward"]

logger = logging.get_logger(__name__)


def omni_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: OmniMaskSpec | torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Transformers' attention function for "omni".

    Args:
        query: ``[B, Hq, Sq, D]``; key, value: ``[B, Hkv, Skv, D]`` (GQA as is, no ``repeat_kv``).
        attention_mask: the layer's `OmniMaskSpec`, None (no mask), or a bool ``[B|1, H|1, Sq, Skv]`` mask.
        scaling, softcap: as in `omni_attention`.
        sliding_window: the layer's window, applied to ``omni_doc_ids`` and to a missing mask.
        is_causal: for a missing mask (default ``module.is_causal``, else True).
        kwargs: ``omni_block_mask``, ``omni_doc_ids``, ``omni_group_ids``, ``cu_seq_lens_k`` (see the module
            docstring); ``omni_context_parallel`` (`omni_hf.distributed.ContextParallel`: the call is this
            rank's shard of a row, attended over the whole row); ``output_attentions`` only warns.
    Returns:
        attn_output ``[B, Sq, Hq, D]`` and None for the weights.
    """
    if dropout > 0:
        raise ValueError("`omni` attention does not support attention dropout. Use the model in eval mode "
                         "(`model.eval()`) or set the attention dropout of its config to 0.")
    if _SPECIAL_KWARGS.isdisjoint(kwargs) and type(attention_mask) is OmniMaskSpec:  # a model's call: the short way
        query, key, value = cast_for_autocast(query, key, value)
        call, key_order = _spec_call(attention_mask, query, key, value, scaling, softcap)
    else:
        _check_kwargs(kwargs)
        if (context_parallel := kwargs.get("omni_context_parallel")) is not None:  # this rank's shard of the row
            out = context_parallel.attention(query, key, value, scale=scaling, softcap=softcap, window=sliding_window)
            return out.transpose(1, 2).contiguous(), None
        block_mask, key_order = _layer_mask(module, query, key, attention_mask, sliding_window, is_causal, kwargs)
        query, key, value = cast_for_autocast(query, key, value)
        call = prepare_call(query, key, value, block_mask, scaling, softcap)
    if key_order is not None:
        key, value = key.index_select(2, key_order), value.index_select(2, key_order)
    out, _ = run_call(call, query, key, value)
    return out.transpose(1, 2).contiguous(), None


# Keyword arguments that change what a call does; a call with none of them and a spec takes the short way.
_SPECIAL_KWARGS = frozenset((*UNSUPPORTED_FEATURES, "output_attentions", "omni_context_parallel", "omni_block_mask",
                             "omni_doc_ids", "omni_group_ids", "cu_seq_lens_k"))


def _check_kwargs(kwargs: dict) -> None:
    """Refuse the features omni cannot honour; warn that attention weights are not returned."""
    for name, feature in UNSUPPORTED_FEATURES.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"`omni` attention does not support {feature}; use `eager` for this model.")
    if kwargs.get("output_attentions"):
        logger.warning_once("`omni` attention does not return attention weights (`output_attentions=True`); "
                            "use `eager` to get them.")


def _layer_mask(module, query, key, mask, sliding_window, is_causal,
                kwargs) -> tuple[OmniBlockMask, torch.Tensor | None]:
    """The layer's block mask and, for a static cache, the key order it assumes (see the module docstring)."""
    q_len, kv_len, device = query.shape[2], key.shape[2], query.device
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    batch = query.shape[0]
    if mask is None and (bounds := kwargs.get("cu_seq_lens_k")) is not None:  # a packed call (packed_towers.py)
        doc = cu_segments(bounds, batch, q_len, kv_len, device)  # each sequence alone: an image, a window
        groups = None if causal else torch.zeros_like(doc)  # bidirectional: each sequence one group
        return OmniBlockMask.from_token_ids(doc, groups, window=sliding_window), None
    if mask is None and not causal:  # an encoder call (a VLM's vision tower): the collator's kwargs describe the LM
        return OmniBlockMask.full(q_len, kv_len), None
    if (block_mask := kwargs.get("omni_block_mask")) is not None:
        _check_block_mask_kwarg(block_mask, batch, q_len, kv_len)
        return _once(mask, ("block", device), lambda: (block_mask.to(device, non_blocking=True), None))
    if kwargs.get("omni_doc_ids") is not None or kwargs.get("omni_group_ids") is not None:
        def from_ids():
            doc, grp = (_token_ids_kwarg(name, kwargs.get(name), minus_one, batch, kv_len, device)
                        for name, minus_one in (("omni_doc_ids", "padding"), ("omni_group_ids", "causal text")))
            doc = doc if doc is not None else torch.zeros_like(grp)
            return OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, window=sliding_window), None
        return _once(mask, ("ids", sliding_window, device), from_ids)
    if isinstance(mask, OmniMaskSpec):
        return _spec_mask(mask, device, kwargs.get("cu_seq_lens_k"))
    if mask is None:
        return OmniBlockMask.causal(q_len, kv_len, window=sliding_window), None  # implicit: nothing built
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        return OmniBlockMask.from_dense(mask.to(device)), None
    raise TypeError(f"attention_mask: expected an OmniMaskSpec (made by the 'omni' mask function), None or a bool "
                    f"[B, H, q_len, kv_len] tensor, got {type(mask).__name__} {getattr(mask, 'dtype', '')}")


def _token_ids_kwarg(name: str, ids, minus_one: str, batch: int, kv_len: int, device) -> torch.Tensor | None:
    """The kwarg ``name`` (``omni_doc_ids`` / ``omni_group_ids``) as int ids ``[B|1, kv_len]`` on ``device``, or None.

    A list (or numpy array) is converted to a tensor. Errors name the kwarg, what was expected and what was received;
    ids below -1 are refused where they are still on the CPU (`omni_hf.mask.validation.check_ids_from_minus_one`).
    """
    if ids is None:
        return None
    if isinstance(ids, (list, tuple, np.ndarray)):
        ids = torch.as_tensor(np.asarray(ids))
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
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


def _check_block_mask_kwarg(block_mask, batch: int, q_len: int, kv_len: int) -> None:
    """``omni_block_mask`` must be an `OmniBlockMask` for this call's sizes; errors name the kwarg."""
    if not isinstance(block_mask, OmniBlockMask):
        raise TypeError(f"omni_block_mask: expected an OmniBlockMask, got {type(block_mask).__name__}")
    if (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
        raise ValueError(f"omni_block_mask: expected q_len={q_len}, kv_len={kv_len} (the tokens of input_ids and any "
                         f"cached before them), got q_len={block_mask.q_len}, kv_len={block_mask.kv_len}")
    if block_mask.batch not in (1, batch):
        raise ValueError(f"omni_block_mask: expected batch 1 or {batch} (that of input_ids), got {block_mask.batch}")


def _spec_mask(spec: OmniMaskSpec, device, cu_seq_lens_k) -> tuple[OmniBlockMask, torch.Tensor | None]:
    """`block_mask_from_spec`, once per forward and device."""
    return _once(spec, ("spec", device), lambda: block_mask_from_spec(spec, device, cu_seq_lens_k))


def _spec_call(spec: OmniMaskSpec, query, key, value, scaling, softcap) -> tuple[PreparedCall, torch.Tensor | None]:
    """The prepared call of the spec's mask and the key order it assumes, once per forward for each device, dtype,
    shapes and scalars of the layers' calls (so the checks and the backend choice run once per forward)."""
    def prepare():
        block_mask, key_order = _spec_mask(spec, query.device, None)
        return prepare_call(query, key, value, block_mask, scaling, softcap), key_order

    return _once(spec, (query.device, query.dtype, query.shape, key.shape, scaling, softcap), prepare)


def _once(spec, key, build: Callable):
    """``build()`` once per forward, cached on the spec all layers share (built per call when there is none)."""
    if not isinstance(spec, OmniMaskSpec):
        return build()
    if key not in spec.built:
        spec.built[key] = build()
    return spec.built[key]
