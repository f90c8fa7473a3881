"""Recognition of Transformers' mask functions: which compositions of `transformers.masking_utils` parts a mask
function is (read from its code object and closures, and by evaluating it on neighbouring positions), and the token
rule they amount to. Functions it does not recognise give None; the spec is then evaluated tile by tile."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import masking_utils
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

from .spec import OmniMaskSpec, key_slice

__all__ = ["sliding_window", "token_rule_parts"]

_AND_CODE = masking_utils.and_masks().__code__
_OR_CODE = masking_utils.or_masks().__code__
_BLOCKWISE_CODE = masking_utils.blockwise_overlay(None).__code__
_SLIDING_CODE = masking_utils.sliding_window_overlay(1).__code__


def sliding_window(fn: Callable) -> int | None:
    """The window of Transformers' ``sliding_window_causal_mask_function(window)`` (causal and a sliding overlay,
    nothing else: no packing), read from its closures; None for any other function, and while compiling."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _AND_CODE:
        return None
    parts = _closure(fn)["mask_functions"]
    overlays = [part for part in parts if part is not causal_mask_function]
    if len(parts) != 2 or len(overlays) != 1 or getattr(overlays[0], "__code__", None) is not _SLIDING_CODE:
        return None
    return _closure(overlays[0])["sliding_window"]


def token_rule_parts(spec: OmniMaskSpec, device) -> tuple[torch.Tensor, torch.Tensor | None, int | None] | None:
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
    causal_blocks = _causal_or_block_ids(fn)
    if causal_blocks is not None:
        return first, key_slice(causal_blocks[0], spec.kv_offset, spec.kv_len, fill=-1), causal_blocks[1]
    windowed = _windowed_causal_or_block_ids(fn)
    if windowed is not None:
        groups = key_slice(windowed[0], spec.kv_offset, spec.kv_len, fill=-1)
        return (first, groups, windowed[1]) if _window_spares_groups(groups, windowed[1]) else None
    return None


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


def _causal_or_block_ids(fn: Callable) -> tuple[torch.Tensor, int | None] | None:
    """The ids and window of ``or_masks(causal, blockwise_overlay(ids))``, read from its closures: a causal mask
    with ``block_sequence_ids`` (Gemma3 / PaliGemma images; window None), or a sliding-window causal one
    (``sliding_window_causal_mask_function(window)``: the sliding layers of Gemma 4 under Transformers 5.9, where the
    window cuts the causal part only and each image stays whole, as the token rule's window does). None for any other
    function, and while compiling (Dynamo cannot read closures)."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _OR_CODE:
        return None
    parts = _closure(fn)["mask_functions"]
    if len(parts) != 2 or getattr(parts[1], "__code__", None) is not _BLOCKWISE_CODE:
        return None
    window = None if parts[0] is causal_mask_function else sliding_window(parts[0])
    if parts[0] is not causal_mask_function and window is None:
        return None
    return _closure(parts[1])["block_sequence_ids"], window


def _windowed_causal_or_block_ids(fn: Callable) -> tuple[torch.Tensor, int] | None:
    """The ids and window of ``and_masks(or_masks(causal_mask_function, blockwise_overlay(ids)),
    sliding_window_overlay(window))`` (the sliding layers of Gemma 3 and Gemma 4 with images, video frames or audio
    placeholders: the window cuts every pair, image pairs included), read from its closures; None for any other
    function, and while compiling."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _AND_CODE:
        return None
    parts = _closure(fn)["mask_functions"]
    if len(parts) != 2 or getattr(parts[1], "__code__", None) is not _SLIDING_CODE:
        return None
    causal_blocks = _causal_or_block_ids(parts[0])
    if causal_blocks is None or causal_blocks[1] is not None:
        return None
    return causal_blocks[0], _closure(parts[1])["sliding_window"]


def _window_spares_groups(groups: torch.Tensor, window: int) -> bool:
    """Whether no two keys of one group (id >= 0) lie ``window`` or more positions apart, so that the window cuts no
    pair of a group: then Transformers' window over the whole rule and the token rule's window over its causal part
    allow the same pairs (they differ only on pairs of a group longer than the window). Known from the sizes when
    the keys span less than the window; otherwise read from the ids, at one host sync (the tile-by-tile evaluation
    it spares syncs once per row of tiles).

    Args:
        groups: int ``[B, kv_len]`` group ids of the keys, -1 for text.
    """
    batch, length = groups.shape
    if length <= window:
        return True
    position = torch.arange(length, device=groups.device).expand(batch, length)
    slot = torch.where(groups >= 0, groups.clamp(max=length - 1), length)  # ids past the length share a slot: safe
    first = torch.full((batch, length + 1), length, device=groups.device).scatter_reduce(1, slot, position, "amin")
    last = torch.full((batch, length + 1), -1, device=groups.device).scatter_reduce(1, slot, position, "amax")
    return not bool((last - first)[:, :length].ge(window).any())


def _closure(fn: Callable) -> dict:
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__)))
