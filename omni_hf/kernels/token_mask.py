"""The library's GPU builder of token-rule masks (``omni_hf::token_mask``, csrc/mask_build/from_token_ids.cu), which
`omni_hf.mask.OmniBlockMask.from_token_ids` calls where it can."""

from __future__ import annotations

import os

import torch

from . import loader

__all__ = ["builds_token_masks", "token_mask"]


def builds_token_masks(ids: torch.Tensor) -> bool:
    """Whether the library builds the token mask of these ids: on a GPU, not being traced by torch.compile (the
    PyTorch build traces into the graph as it is), not forced to PyTorch, and the library loads."""
    if not ids.is_cuda or torch.compiler.is_compiling() or os.environ.get("OMNI_HF_BACKEND") == "reference":
        return False
    return loader.available()


def token_mask(doc_ids: torch.Tensor, group_ids: torch.Tensor, q_len: int, block_q: int, block_kv: int,
               window: int | None, window_covers_groups: bool = False) -> list[torch.Tensor]:
    """The row and column views and the token ranges of `OmniBlockMask.from_token_ids`, built by the library in four
    launches (no host sync).

    Args:
        doc_ids, group_ids: int32 ``[B, kv_len]`` contiguous, on one CUDA device (checked by the caller).
        q_len: at most kv_len; block_q, block_kv: 64 or 128; window: None or > 0.
        window_covers_groups: whether the window cuts group pairs too (`omni_hf.mask.token_rule`).
    Returns:
        kv_num_blocks, kv_indices, kv_types, kv_partial, q_num_blocks, q_indices, q_types, q_partial with
        mask heads 1, and token_ranges ``[B, kv_len, 4]``: byte for byte what the PyTorch build gives.
    """
    return list(torch.ops.omni_hf.token_mask.default(doc_ids, group_ids, q_len, block_q, block_kv, window or 0,
                                                     window_covers_groups))
