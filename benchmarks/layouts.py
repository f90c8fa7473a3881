"""Token layouts the benchmarks share: a packed, interleaved VLM sequence as token-rule ids."""

from __future__ import annotations

import numpy as np
import torch


def vlm_token_ids(seq_len: int, seed: int = 0, image_tokens: int = 576) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed documents of 2k-6k tokens; inside each, text runs of 16-256 tokens alternate with images.

    Returns doc_ids, group_ids: int32 ``[1, seq_len]`` (every image its own group; no padding).
    """
    rng = np.random.default_rng(seed)
    doc = np.empty(seq_len, dtype=np.int32)
    grp = np.full(seq_len, -1, dtype=np.int32)
    start, document, image = 0, 0, 0
    while start < seq_len:
        end = min(seq_len, start + int(rng.integers(2048, 6145)))
        doc[start:end] = document
        cursor = start
        while cursor < end:
            cursor += int(rng.integers(16, 257))  # a text run
            if cursor + image_tokens <= end:
                grp[cursor:cursor + image_tokens] = image
                image += 1
                cursor += image_tokens
        start, document = end, document + 1
    return torch.from_numpy(doc)[None], torch.from_numpy(grp)[None]


def allowed_pairs(doc: torch.Tensor, grp: torch.Tensor) -> int:
    """Number of allowed (q, k) pairs of the token rule (q_len == kv_len, no window), in O(S):
    causal pairs per document plus, per image, the pairs above the diagonal inside it."""
    total = 0
    for row_doc, row_grp in zip(doc.tolist(), grp.tolist()):
        _, doc_sizes = np.unique([d for d in row_doc if d >= 0], return_counts=True)
        _, grp_sizes = np.unique([g for g, d in zip(row_grp, row_doc) if g >= 0 and d >= 0], return_counts=True)
        total += int((doc_sizes * (doc_sizes + 1) // 2).sum() + (grp_sizes * (grp_sizes - 1) // 2).sum())
    return total
