"""Recognition of Transformers' mask functions: which compositions of `transformers.masking_utils` parts a mask
function is (read from its code object and closures, and by evaluating it on neighbouring positions), and the token
rule they amount to. Functions it does not recognise give None; the spec is then evaluated tile by tile."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from transformers import masking_utils
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

from .spec import OmniMaskSpec, key_slice

__all__ = ["TokenRuleParts", "sliding_window", "token_rule_parts"]

_AND_CODE = masking_utils.and_masks().__code__
_OR_CODE = masking_utils.or_masks().__code__
_BLOCKWISE_CODE = masking_utils.blockwise_overlay(None).__code__
_SLIDING_CODE = masking_utils.sliding_window_overlay(1).__code__
_PACKED_CODE = masking_utils.packed_sequence_mask_function(None).__code__
# Releases from 5.24 on also read the inner function at positions counted from each packed sequence's start.
_REMAP = getattr(masking_utils, "remap_positions_for_packed_sequence", None)
_REMAP_CODE = None if _REMAP is None else _REMAP(None, None).__code__


class TokenRuleParts(NamedTuple):
    """A mask function as the token rule (`omni_hf.mask.token_rule`).

    Attributes:
        starts: bool ``[B|1, kv_len]``, True where a key starts a document.
        groups: int ``[B|1, kv_len]`` image groups (-1 text), or None (all text).
        window: the sliding window, or None.
        window_covers_groups: whether the window cuts group pairs too (the rule's `window_covers_groups`).
    """

    starts: torch.Tensor
    groups: torch.Tensor | None
    window: int | None
    window_covers_groups: bool = False


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


def token_rule_parts(spec: OmniMaskSpec, device) -> TokenRuleParts | None:
    """The spec's mask function as the token rule, or None when it is not one this recognises.

    Recognised: causal; bidirectional over the queries' own keys; plain causal compositions (packing, a sliding
    window, chunks); causal or image blocks (``or_masks(causal_mask_function, blockwise_overlay(ids))``: Gemma 3,
    PaliGemma) and that under a sliding window (``and_masks(..., sliding_window_overlay(window))``: the sliding
    layers of Gemma 3 and Gemma 4, whose window cuts image pairs too), each also packed by ``position_ids``. Reading
    them costs no host sync.
    """
    fn = spec.mask_function
    filled = spec.q_offset + spec.q_len - spec.kv_offset
    if isinstance(filled, int) and filled > spec.kv_len:  # queries past the keys (multi-token prediction caches)
        return None
    first = (torch.arange(spec.kv_len, device=device) == 0)[None]
    if fn is causal_mask_function:
        return TokenRuleParts(first, None, None)
    if fn is bidirectional_mask_function:
        if spec.q_len != spec.kv_len or not isinstance(spec.q_offset, int) or spec.q_offset != spec.kv_offset:
            return None  # cross-attention or a cache: padding queries would need their own ids
        return TokenRuleParts(first, torch.zeros_like(first, dtype=torch.int32), None)  # packed encoder rows
    if spec.plain_causal and getattr(fn, "__code__", None) is _AND_CODE:
        return TokenRuleParts(_probe_starts(spec, device), None, spec.window)
    inner, positions, sequences = _unpacked(fn)
    starts = first if sequences is None else _sequence_starts(key_slice(sequences, spec.kv_offset, spec.kv_len, -1))
    causal_blocks = _causal_or_block_ids(inner)
    if causal_blocks is not None:  # the window, if any, over the causal part only: the token rule's default
        return TokenRuleParts(starts, _key_groups(causal_blocks[0], positions, spec), causal_blocks[1])
    windowed = _windowed_causal_or_block_ids(inner)
    if windowed is not None:
        return TokenRuleParts(starts, _key_groups(windowed[0], positions, spec), windowed[1], True)
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


def _unpacked(fn: Callable) -> tuple[Callable, torch.Tensor | None, torch.Tensor | None]:
    """``fn`` without Transformers' packing by ``position_ids`` (``and_masks(inner, packed_sequence_mask_function(
    sequences))``, the inner function read at ``position_ids`` from 5.24 on): ``(inner, position_ids [B, L] or None,
    sequences [B, L])``, or ``(fn, None, None)`` where it is not packed, and while compiling."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _AND_CODE:
        return fn, None, None
    parts = _closure(fn)["mask_functions"]
    if len(parts) != 2 or getattr(parts[1], "__code__", None) is not _PACKED_CODE:
        return fn, None, None
    inner, positions = parts[0], None
    if _REMAP_CODE is not None and getattr(inner, "__code__", None) is _REMAP_CODE:
        inner, positions = _closure(inner)["mask_function"], _closure(inner)["position_ids"]
    return inner, positions, _closure(parts[1])["packed_sequence_mask"]


def _sequence_starts(sequences: torch.Tensor) -> torch.Tensor:
    """bool ``[B, L]``: True where a key's packed sequence differs from the key's before (always at key 0)."""
    starts = torch.ones_like(sequences, dtype=torch.bool)
    starts[:, 1:] = sequences[:, 1:] != sequences[:, :-1]
    return starts


def _key_groups(block_ids: torch.Tensor, positions: torch.Tensor | None, spec: OmniMaskSpec) -> torch.Tensor:
    """The image group of each key, int ``[B|1, kv_len]`` (-1 text): ``block_ids`` at the keys' positions, which
    packing by ``position_ids`` counts from each sequence's start (read so, as Transformers reads them; a position
    past the ids, which Transformers would index out of range, reads the last id)."""
    if positions is not None:
        batch = max(block_ids.shape[0], positions.shape[0])
        at = positions.to(block_ids.device).clamp(0, block_ids.shape[1] - 1).expand(batch, -1)
        block_ids = block_ids.expand(batch, -1).gather(1, at)
    return key_slice(block_ids, spec.kv_offset, spec.kv_len, fill=-1)


def _causal_or_block_ids(fn: Callable) -> tuple[torch.Tensor, int | None] | None:
    """The ids and window of ``or_masks(causal, blockwise_overlay(ids))``, read from its closures: a causal mask
    with ``block_sequence_ids`` (Gemma3 / PaliGemma images; window None), or a sliding-window causal one
    (``sliding_window_causal_mask_function(window)``: the sliding layers of Gemma 4 under Transformers 5.9, where the
    window cuts the causal part only and each image stays whole, as the token rule's window does); either may be
    remapped to positions within packed sequences (Gemma 3's packed rows under 5.24, whose packing ands the sequences
    outside: `_unpacked`). None for any other function, and while compiling (Dynamo cannot read closures)."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _OR_CODE:
        return None
    parts = _closure(fn)["mask_functions"]
    if len(parts) != 2 or getattr(parts[1], "__code__", None) is not _BLOCKWISE_CODE:
        return None
    first = parts[0]
    if _REMAP_CODE is not None and getattr(first, "__code__", None) is _REMAP_CODE:
        first = _closure(first)["mask_function"]  # packed rows (5.24): causal on positions within each sequence
    window = None if first is causal_mask_function else sliding_window(first)
    if first is not causal_mask_function and window is None:
        return None
    return _closure(parts[1])["block_sequence_ids"], window


def _windowed_causal_or_block_ids(fn: Callable) -> tuple[torch.Tensor, int] | None:
    """The ids and window of ``and_masks(or_masks(causal_mask_function, blockwise_overlay(ids)),
    sliding_window_overlay(window))`` (the sliding layers of Gemma 3 and Gemma 4 with images, video frames or audio
    placeholders: the window cuts every pair, image pairs included: the token rule with `window_covers_groups`),
    read from its closures; None for any other function, and while compiling."""
    if torch.compiler.is_compiling() or getattr(fn, "__code__", None) is not _AND_CODE:
        return None
    parts = _closure(fn)["mask_functions"]
    if len(parts) != 2 or getattr(parts[1], "__code__", None) is not _SLIDING_CODE:
        return None
    causal_blocks = _causal_or_block_ids(parts[0])
    if causal_blocks is None or causal_blocks[1] is not None:
        return None
    return causal_blocks[0], _closure(parts[1])["sliding_window"]


def _closure(fn: Callable) -> dict:
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__)))
