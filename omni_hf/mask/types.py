"""Block types, mask kinds and block sizes: the values the C header (`csrc/include/omni_attention.h`) shares; the
block sizes come from the generated table the library is built from (`omni_hf.kernels.table`)."""

from __future__ import annotations

import enum

import torch

from ..kernels.table import BLOCK_SIZES

__all__ = ["BLOCK_SIZES", "BlockType", "MaskKind", "block_size_pair"]


class BlockType(enum.IntEnum):
    """What a (Q block, KV block) pair allows; values match `OmniBlockType` in the C header."""

    MASKED = 0
    FULL = 1
    CAUSAL = 2
    PARTIAL = 3


class MaskKind(enum.IntEnum):
    """How an `OmniBlockMask` is given; values match `OmniMaskKind` in the C header.

    ``BLOCKS``: block lists (with a pattern pool and / or token ids). ``CAUSAL`` (bottom-right causal, optional
    sliding window) and ``FULL`` (every key) are implicit: their sizes describe them, so they hold no tensors,
    cost nothing to build, serve every device, and the kernels derive each block from its position.
    """

    BLOCKS = 0
    CAUSAL = 1
    FULL = 2


# Plain ints for tensor comparisons: under vmap a tensor compared with an IntEnum gives a Python bool,
# and Dynamo does not trace IntEnum members.
MASKED, FULL, CAUSAL, PARTIAL = (int(t) for t in BlockType)


def block_type(masked: torch.Tensor, full: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """int8 types from bool claims, in priority MASKED > FULL > CAUSAL > PARTIAL, by uint8 arithmetic:
    ``(3 - 2 full - causal + causal full) * not masked`` (uint8 wraps in between, never at the end)."""
    f, c, m = (x.to(torch.uint8) for x in (full, causal, masked))  # a cast: Inductor cannot bitcast bool
    return ((3 - 2 * f - c + c * f) * (1 - m)).to(torch.int8)


def block_size_pair(block_size) -> tuple[int, int]:
    """``(block_q, block_kv)`` from ``block_size``: an int for both, or a ``(block_q, block_kv)`` pair (as
    FlexAttention's ``BLOCK_SIZE``); each one of `BLOCK_SIZES`. Raises ValueError naming ``block_size``."""
    pair = (block_size, block_size) if isinstance(block_size, int) else block_size
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or any(
            isinstance(size, bool) or size not in BLOCK_SIZES for size in pair):
        raise ValueError(f"block_size: expected one of {BLOCK_SIZES} or a (block_q, block_kv) pair of them, "
                         f"got {block_size!r}")
    return int(pair[0]), int(pair[1])
