"""``attn_implementation="omni"`` for Hugging Face Transformers.

`register` adds "omni" to Transformers' `AttentionInterface` and `AttentionMaskInterface`. The mask function,
`omni_mask`, runs where a model creates its masks and returns an `OmniMaskSpec` (sizes, offsets, the 2D
padding mask and Transformers' mask function), never a dense mask. Every layer receives that spec; the first
one builds the `OmniBlockMask` and caches it there, so the mask is built once per forward.

`omni_attention_forward` picks its mask, first match wins:

1. an ``omni_block_mask`` kwarg (an `OmniBlockMask`), as is;
2. ``omni_doc_ids`` / ``omni_group_ids`` kwargs (the collator's token ids, ``[B, kv_len]``), with the layer's
   sliding window on the causal part;
3. the spec. Plain causal, sliding-window and bidirectional attention over unpadded, bottom-right aligned keys
   become implicit masks (`OmniBlockMask.causal` / `full`: nothing is built; during generation an all-ones
   padding mask counts as none, at one host sync per step as with sdpa); bidirectional attention over padded
   keys (encoders, cross-attention) becomes `OmniBlockMask.from_key_padding`. Other recognised mask functions
   become the token rule (`OmniBlockMask.from_token_ids`: vectorised, on the GPU, no host sync): causal ones
   with padding and caches, bidirectional ones packed by ``cu_seq_lens_k``; Transformers' own
   compositions of causal with packing (``position_ids`` that restart), sliding windows and chunks, whose
   document starts are read by evaluating the function on neighbouring positions; and causal with image
   blocks (``block_sequence_ids`` from ``token_type_ids``). ``cu_seq_lens_k`` (DataCollatorWithFlattening)
   adds document starts. Anything else is evaluated tile by tile (`OmniBlockMask.from_mask_fn`: exact, but
   it syncs and breaks a compiled graph);
4. no mask: causal, or bidirectional when ``is_causal`` is False (vision towers), both implicit. Such an encoder
   call runs bidirectional even when 1. or 2. are given: they describe the language model's tokens (Qwen2-VL
   hands its vision tower the forward's kwargs).

Positions are bottom-right aligned (query ``i`` at ``i + kv_len - q_len``). Static caches hand over their whole
buffer, so their keys are rotated to end at the last filled slot, and unfilled slots are masked. Under the token
rule (causal-family masks with padding, packing, image blocks) rows of padding tokens output zeros; bidirectional
masks never mask a query row (a cross-attention query is not one of the keys), and masks evaluated tile by tile
give those rows what the mask function gives. Transformers leaves rows of padding tokens arbitrary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from transformers import AttentionInterface, masking_utils
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function, causal_mask_function
from transformers.utils import logging

from ..mask import OmniBlockMask
from ..ops import omni_attention

__all__ = ["OmniMaskSpec", "omni_attention_forward", "omni_mask", "register"]

logger = logging.get_logger(__name__)

_AND_CODE = masking_utils.and_masks().__code__
_OR_CODE = masking_utils.or_masks().__code__
_BLOCKWISE_CODE = masking_utils.blockwise_overlay(None).__code__
_SLIDING_CODE = masking_utils.sliding_window_overlay(1).__code__


def register() -> None:
    """Register "omni" in Transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register("omni", omni_attention_forward)
    AttentionMaskInterface.register("omni", omni_mask)


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
    padding = None if attention_mask is None else _key_slice(attention_mask.bool(), kv_offset, kv_length, fill=False)
    if padding is not None and _generating(q_offset, kv_offset) and bool(padding.all()):
        padding = None  # unpadded generation: one host sync per step, as sdpa's, keeps the mask implicit
    plain_causal = not use_vmap and "allow_is_bidirectional_skip" not in kwargs
    return OmniMaskSpec(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, padding, local_size,
                        plain_causal)


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
            docstring); ``omni_context_parallel`` (`omni_hf.context_parallel.ContextParallel`: the call is this
            rank's shard of a row, attended over the whole row); ``output_attentions`` only warns.
    Returns:
        attn_output ``[B, Sq, Hq, D]`` and None for the weights.
    """
    if dropout > 0:
        raise ValueError("`omni` attention does not support attention dropout. Use the model in eval mode "
                         "(`model.eval()`) or set the attention dropout of its config to 0.")
    for name in ("s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise ValueError(f"`omni` attention does not support `{name}`; use `eager` for this model.")
    if kwargs.get("output_attentions"):
        logger.warning_once("`omni` attention does not return attention weights (`output_attentions=True`); "
                            "use `eager` to get them.")
    if (context_parallel := kwargs.get("omni_context_parallel")) is not None:  # this rank's shard of the row
        out = context_parallel.attention(query, key, value, scale=scaling, softcap=softcap, window=sliding_window)
        return out.transpose(1, 2).contiguous(), None
    block_mask, key_order = _layer_mask(module, query, key, attention_mask, sliding_window, is_causal, kwargs)
    if key_order is not None:
        key, value = key.index_select(2, key_order), value.index_select(2, key_order)
    out = omni_attention(query, key, value, block_mask, scale=scaling, softcap=softcap)
    return out.transpose(1, 2).contiguous(), None


def _layer_mask(module, query, key, mask, sliding_window, is_causal,
                kwargs) -> tuple[OmniBlockMask, torch.Tensor | None]:
    """The layer's block mask and, for a static cache, the key order it assumes (see the module docstring)."""
    q_len, kv_len, device = query.shape[2], key.shape[2], query.device
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if mask is None and not causal:  # an encoder call (a VLM's vision tower): the collator's kwargs describe the LM
        return OmniBlockMask.full(q_len, kv_len), None
    if (block_mask := kwargs.get("omni_block_mask")) is not None:
        return _once(mask, ("block", device), lambda: (block_mask.to(device, non_blocking=True), None))
    doc_ids, group_ids = kwargs.get("omni_doc_ids"), kwargs.get("omni_group_ids")
    if doc_ids is not None or group_ids is not None:
        def from_ids():
            doc = (doc_ids if doc_ids is not None else torch.zeros_like(group_ids)).to(device, non_blocking=True)
            grp = None if group_ids is None else group_ids.to(device, non_blocking=True)
            return OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, window=sliding_window), None
        return _once(mask, ("ids", sliding_window, device), from_ids)
    if isinstance(mask, OmniMaskSpec):
        return _once(mask, ("spec", device), lambda: _from_spec(mask, device, kwargs.get("cu_seq_lens_k")))
    if mask is None:
        return OmniBlockMask.causal(q_len, kv_len, window=sliding_window), None  # implicit: nothing built
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
        return OmniBlockMask.from_dense(mask.to(device)), None
    raise TypeError(f"attention_mask: expected an OmniMaskSpec (made by the 'omni' mask function), None or a bool "
                    f"[B, H, q_len, kv_len] tensor, got {type(mask).__name__} {getattr(mask, 'dtype', '')}")


def _once(spec, key, build: Callable):
    """``build()`` once per forward, cached on the spec all layers share (built per call when there is none)."""
    if not isinstance(spec, OmniMaskSpec):
        return build()
    if key not in spec.built:
        spec.built[key] = build()
    return spec.built[key]


def _from_spec(spec: OmniMaskSpec, device, cu_seq_lens_k) -> tuple[OmniBlockMask, torch.Tensor | None]:
    """The spec's block mask (token rule where its function is recognised, else tile by tile) and key order."""
    segments = None if cu_seq_lens_k is None else _cu_segments(cu_seq_lens_k, spec, device)
    if segments is None and (implicit := _implicit_mask(spec)) is not None:
        return implicit, None
    rule = _token_rule(spec, device)
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
    window = _sliding_window(spec.mask_function)
    return None if window is None else OmniBlockMask.causal(spec.q_len, spec.kv_len, window=window)


def _sliding_window(fn: Callable) -> int | None:
    """The window of Transformers' ``sliding_window_causal_mask_function(window)`` (causal and a sliding overlay,
    nothing else: no packing), read from its closures; None for any other function, and while compiling."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _AND_CODE:
        return None
    parts = _closure(fn)["mask_functions"]
    overlays = [part for part in parts if part is not causal_mask_function]
    if len(parts) != 2 or len(overlays) != 1 or getattr(overlays[0], "__code__", None) is not _SLIDING_CODE:
        return None
    return _closure(overlays[0])["sliding_window"]


def _token_rule(spec: OmniMaskSpec, device) -> tuple[torch.Tensor, torch.Tensor | None, int | None] | None:
    """The spec's mask function as the token rule, or None when it is not one this recognises.

    Returns document starts bool ``[B|1, kv_len]`` (True where a key starts a document), image groups int
    ``[B|1, kv_len]`` or None (all text), and the sliding window of the causal part.
    """
    fn = spec.mask_function
    filled = spec.q_offset + spec.q_len - spec.kv_offset
    if isinstance(filled, int) and filled > spec.kv_len:  # queries past the keys (multi-token prediction caches)
        return None
    first = (torch.arange(spec.kv_len, device=device) == 0)[None]
    if fn is causal_mask_function:
        return first, None, None
    if fn is bidirectional_mask_function:
        if spec.q_len != spec.kv_len or not isinstance(spec.q_offset, int) or spec.q_offset != spec.kv_offset:
            return None  # cross-attention or a cache: padding queries would need their own ids
        return first, torch.zeros_like(first, dtype=torch.int32), None  # packed (cu_seq_lens_k) encoder rows
    if spec.plain_causal and getattr(fn, "__code__", None) is _AND_CODE:
        return _probe_starts(spec, device), None, spec.window
    block_ids = _causal_or_block_ids(fn)
    if block_ids is not None:
        return first, _key_slice(block_ids, spec.kv_offset, spec.kv_len, fill=-1), None
    return None


def _generating(q_offset: int | torch.Tensor, kv_offset: int) -> bool:
    """An eager call with a cache (queries after position 0): the decoding loop, which syncs every step anyway."""
    return isinstance(q_offset, int) and q_offset + kv_offset > 0 and not torch.compiler.is_compiling()


def _probe_starts(spec: OmniMaskSpec, device) -> torch.Tensor:
    """Document starts of a plain causal composition, bool ``[B, kv_len]``: a key starts one where the function
    forbids it to see the key before.

    The compositions (causal with packing, a sliding window or chunks, in any mix) all read "same document and
    same chunk and causal and inside the window", and neighbours are inside any window of 2 or more; with a
    window of 1 every key becomes its own document, which is the same mask. So the token rule with these
    starts and the creator's window (``local_size``; harmless for chunks) is exact.
    """
    batch = torch.arange(spec.batch_size, device=device)[:, None]
    position = torch.arange(spec.kv_len, device=device)[None] + spec.kv_offset
    linked = spec.mask_function(batch, torch.zeros_like(batch), position, position - 1)
    return ~linked.expand(spec.batch_size, spec.kv_len) | (position == spec.kv_offset)


def _causal_or_block_ids(fn: Callable) -> torch.Tensor | None:
    """The ids of ``or_masks(causal_mask_function, blockwise_overlay(ids))`` (a causal mask with
    ``block_sequence_ids``: Gemma3 / PaliGemma images), read from its closures; None for any other function,
    and while compiling (Dynamo cannot read closures)."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _OR_CODE:
        return None
    parts = _closure(fn)["mask_functions"]
    blocks = len(parts) == 2 and getattr(parts[1], "__code__", None) is _BLOCKWISE_CODE
    return _closure(parts[1])["block_sequence_ids"] if blocks and parts[0] is causal_mask_function else None


def _closure(fn: Callable) -> dict:
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__)))


def _key_slice(ids: torch.Tensor, kv_offset: int, kv_len: int, fill) -> torch.Tensor:
    """Columns ``kv_offset : kv_offset + kv_len`` of per-position ``ids [B, L]``, padded with ``fill`` past ``L``."""
    end = kv_offset + kv_len
    return torch.nn.functional.pad(ids, (0, max(0, end - ids.shape[-1])), value=fill)[:, kv_offset:end]


def _key_order(spec: OmniMaskSpec, device) -> torch.Tensor | None:
    """Key order that makes the filled slots of a static cache end the buffer, as bottom-right alignment needs
    (slot ``(j + filled) % kv_len`` becomes key ``j``); None when they already do."""
    filled = spec.q_offset + spec.q_len - spec.kv_offset
    if isinstance(filled, int) and filled == spec.kv_len:
        return None
    return (torch.arange(spec.kv_len, device=device) + filled) % spec.kv_len


def _cu_segments(cu_seq_lens_k: torch.Tensor, spec: OmniMaskSpec, device) -> torch.Tensor:
    """The packed sequence of each key from ``cu_seq_lens_k``, -1 past the last one: int ``[1, kv_len]``."""
    if spec.batch_size != 1 or spec.q_len != spec.kv_len:
        raise ValueError(f"cu_seq_lens_k: expected a flattened batch of one row and no cache, got batch "
                         f"{spec.batch_size}, q_len {spec.q_len}, kv_len {spec.kv_len}")
    bounds = cu_seq_lens_k.to(device)
    position = torch.arange(spec.kv_len, device=device, dtype=bounds.dtype)
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

