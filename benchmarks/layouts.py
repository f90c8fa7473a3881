"""The benchmark's masks, each written from its definition, independently of how omni builds its own.

A `Layout` is one mask at one length. Token-rule layouts (causal, packed documents, VLM, prefix-LM,
sliding window) hold per-token ``doc`` / ``grp`` ids and the rule of DESIGN.md; the random-block layout
holds a block table with a pool of PARTIAL patterns. From that definition a layout gives:

- `Layout.mask_mod`: the FlexAttention ``mask_mod`` (also what the dense masks are evaluated from);
- `Layout.dense`: the dense bool ``[S, S]`` an SDPA peer (and the float32 reference) receives;
- `Layout.allowed_pairs`: the exact number of allowed (q, k) pairs, in O(S) or O(blocks), nothing S x S;
- `Layout.omni_mask`: omni's own mask, built the way a user would (`OmniBlockMask.causal`,
  `from_token_ids`, or `from_mask_fn` for the block table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from omni_hf import BlockType, OmniBlockMask

IMAGE_TOKENS = 576
RANDOM_BLOCK = 128  # granularity of the random block table (omni blocks of 64 split it, of 128 match it)
RANDOM_POOL = 8  # distinct PARTIAL patterns in the random layout
MASKS = ("causal", "documents", "vlm", "prefix_lm", "sliding_window", "random_blocks")
_DENSE_CHUNK = 1 << 26  # elements per chunk when a dense mask is evaluated


def window_for(seq_len: int) -> int:
    """The sliding window of the sliding-window layout: 1024 (Gemma 3's local layers), a quarter of
    the row at small lengths."""
    return min(1024, seq_len // 4)


@dataclasses.dataclass(frozen=True)
class BlockTable:
    """A random block mask: ``types`` int8 ``[n, n]`` (`BlockType` per block of ``size`` tokens),
    ``pattern`` int64 ``[n, n]`` (pool index of PARTIAL blocks, else -1), ``pool`` bool ``[P, size, size]``."""

    types: np.ndarray
    pattern: np.ndarray
    pool: np.ndarray
    size: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """One mask of length ``seq_len``: token-rule ids (``doc``, ``grp`` int32 ``[S]``, optional
    ``window``) or a ``blocks`` table. ``is_causal``: exactly the causal mask (SDPA's ``is_causal``)."""

    name: str
    seq_len: int
    doc: np.ndarray | None = None
    grp: np.ndarray | None = None
    window: int | None = None
    blocks: BlockTable | None = None
    is_causal: bool = False

    @property
    def token_rule(self) -> bool:
        return self.doc is not None

    # ------------------------------------------------------------------ the definition

    def mask_mod(self, device: torch.device | str = "cpu") -> Callable[..., torch.Tensor]:
        """``mask_mod(b, h, q_idx, kv_idx) -> bool`` (broadcastable index tensors), for Flex and dense."""
        if self.is_causal:
            return lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
        if self.blocks is not None:
            return _block_table_mask_mod(self.blocks, device)
        doc, grp = (torch.from_numpy(x).to(device) for x in (self.doc, self.grp))
        window = self.window

        def mask_mod(b, h, q_idx, kv_idx):
            near = kv_idx <= q_idx
            if window is not None:
                near = near & (q_idx - kv_idx < window)
            same_doc = (doc[q_idx] >= 0) & (doc[q_idx] == doc[kv_idx])
            return same_doc & (near | ((grp[q_idx] >= 0) & (grp[q_idx] == grp[kv_idx])))

        return mask_mod

    def dense_rows(self, start: int, stop: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """bool ``[stop - start, S]``: rows ``start:stop`` of the dense mask."""
        q = torch.arange(start, stop, device=device)[:, None]
        kv = torch.arange(self.seq_len, device=device)[None, :]
        zero = torch.zeros((), dtype=torch.long, device=device)
        return self.mask_mod(device)(zero, zero, q, kv).expand(stop - start, self.seq_len)

    def dense(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """bool ``[S, S]`` (True = allowed), evaluated in row chunks."""
        out = torch.empty(self.seq_len, self.seq_len, dtype=torch.bool, device=device)
        rows = max(1, _DENSE_CHUNK // self.seq_len)
        for start in range(0, self.seq_len, rows):
            stop = min(start + rows, self.seq_len)
            out[start:stop] = self.dense_rows(start, stop, device)
        return out

    def allowed_pairs(self) -> int:
        """Exact count of allowed (q, k) pairs, from the definition without anything S x S."""
        if self.blocks is not None:
            return _block_table_pairs(self.blocks)
        return token_rule_pairs(self.doc, self.grp, self.window)

    # ------------------------------------------------------------------ omni's mask

    @property
    def omni_builder(self) -> str:
        """How `omni_mask` builds omni's mask (the name reported beside its build time)."""
        if self.is_causal:
            return "OmniBlockMask.causal"
        return "from_mask_fn" if self.blocks is not None else "from_token_ids"

    def omni_mask(self, block: int = 128, device: torch.device | str = "cpu",
                  ids: tuple[torch.Tensor, torch.Tensor] | None = None) -> OmniBlockMask:
        """omni's mask with blocks of ``block``; ``ids``: the doc / grp ids already on ``device``."""
        if self.is_causal:
            return OmniBlockMask.causal(self.seq_len, block_size=block)  # implicit: nothing to build
        if self.blocks is not None:
            return OmniBlockMask.from_mask_fn(self.mask_mod(device), self.seq_len, block_size=block,
                                              device=device)
        doc, grp = ids if ids is not None else self.token_ids(device)
        return OmniBlockMask.from_token_ids(doc, grp, block_size=block, window=self.window)

    def token_ids(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """doc / grp ids as int32 ``[1, S]`` tensors on ``device``."""
        return tuple(torch.from_numpy(x)[None].to(device) for x in (self.doc, self.grp))


# ---------------------------------------------------------------------- builders


def build(name: str, seq_len: int, seed: int = 0) -> Layout:
    """The layout ``name`` (one of `MASKS`) at ``seq_len`` tokens, drawn from ``seed``."""
    if name not in MASKS:
        raise ValueError(f"mask: expected one of {MASKS}, got {name!r}")
    if name == "causal":
        return Layout(name, seq_len, np.zeros(seq_len, np.int32), np.full(seq_len, -1, np.int32), is_causal=True)
    if name == "vlm":
        return Layout(name, seq_len, *vlm_ids(seq_len, seed))
    if name == "sliding_window":
        return Layout(name, seq_len, np.zeros(seq_len, np.int32), np.full(seq_len, -1, np.int32),
                      window=window_for(seq_len))
    if name == "random_blocks":
        return Layout(name, seq_len, blocks=random_block_table(seq_len, seed))
    doc = document_ids(seq_len, seed)
    grp = prefix_groups(doc, seed) if name == "prefix_lm" else np.full(seq_len, -1, np.int32)
    return Layout(name, seq_len, doc, grp)


def document_ids(seq_len: int, seed: int = 0) -> np.ndarray:
    """int32 ``[S]``: packed documents of ``S/16`` to ``S/4`` tokens (the last one cut at the row's end)."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < seq_len:
        lengths.append(int(rng.integers(max(1, seq_len // 16), max(2, seq_len // 4) + 1)))
    return np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)[:seq_len]


def prefix_groups(doc: np.ndarray, seed: int = 0) -> np.ndarray:
    """int32 ``[S]``: each document's first 10-60% of tokens as one bidirectional group (prefix-LM)."""
    rng = np.random.default_rng(seed + 1)
    grp = np.full(len(doc), -1, np.int32)
    starts = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
    for index, (start, end) in enumerate(zip(starts, np.r_[starts[1:], len(doc)])):
        prefix = max(1, int(round(rng.uniform(0.1, 0.6) * (end - start))))
        grp[start:start + prefix] = index
    return grp


def vlm_ids(seq_len: int, seed: int = 0, image_tokens: int = IMAGE_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """doc / group ids int32 ``[S]`` of one packed VLM row: documents of 2k-6k tokens, each alternating
    text runs of 16-256 tokens with images of ``image_tokens`` (one group id per image; an image is cut
    at its document's end). Below 2k tokens the row holds one document."""
    rng = np.random.default_rng(seed)
    doc = np.empty(seq_len, np.int32)
    grp = np.full(seq_len, -1, np.int32)
    pos, d, g = 0, 0, 0
    while pos < seq_len:
        end = min(pos + int(rng.integers(2048, 6145)), seq_len)
        doc[pos:end] = d
        p = pos
        while p < end:
            p += int(rng.integers(16, 257))  # text run
            img_end = min(p + image_tokens, end)
            if p < img_end:
                grp[p:img_end] = g
                g += 1
            p = img_end
        pos, d = end, d + 1
    return doc, grp


def random_block_table(seq_len: int, seed: int = 0, size: int = RANDOM_BLOCK) -> BlockTable:
    """A seed-style random mixture over blocks of ``size``: CAUSAL on the diagonal (every row sees
    itself), below it 30% MASKED, 35% FULL, 35% PARTIAL with one of `RANDOM_POOL` random patterns
    (half the bits set), nothing above it."""
    if seq_len % size:
        raise ValueError(f"seq_len: expected a multiple of {size} for the random block layout, got {seq_len}")
    rng = np.random.default_rng(seed)
    n = seq_len // size
    draw = rng.choice([int(BlockType.MASKED), int(BlockType.FULL), int(BlockType.PARTIAL)], size=(n, n),
                      p=[0.3, 0.35, 0.35])
    below = np.tril(np.ones((n, n), bool), -1)
    types = np.where(below, draw, int(BlockType.MASKED)).astype(np.int8)
    np.fill_diagonal(types, int(BlockType.CAUSAL))
    pattern = np.where(types == int(BlockType.PARTIAL), rng.integers(0, RANDOM_POOL, (n, n)), -1)
    pool = rng.random((RANDOM_POOL, size, size)) < 0.5
    return BlockTable(types, pattern, pool, size)


# ---------------------------------------------------------------------- counts and rules


def _run_bounds(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every token, the start and end (exclusive) of its run of equal ids."""
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    run = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(ids)]))
    return starts[run], ends[run]


def token_rule_pairs(doc: np.ndarray, grp: np.ndarray, window: int | None = None) -> int:
    """Allowed pairs of the token rule (q_len == kv_len) over ids whose documents and groups are
    contiguous runs, each group inside one document. Per query ``i``: the causal keys of its document
    inside the window, plus the keys of its group that are not among them."""
    i = np.arange(len(doc), dtype=np.int64)
    w = len(doc) if window is None else window
    doc_start, _ = _run_bounds(doc)
    grp_start, grp_end = _run_bounds(grp)
    causal = np.minimum(i - doc_start + 1, w)
    beyond = (grp_end - i - 1) + np.maximum(0, (i - w + 1) - grp_start)  # group keys after i or out of window
    return int(np.where(doc >= 0, causal, 0).sum() + np.where((doc >= 0) & (grp >= 0), beyond, 0).sum())


def _block_table_pairs(table: BlockTable) -> int:
    s = table.size
    full = int((table.types == int(BlockType.FULL)).sum()) * s * s
    causal = int((table.types == int(BlockType.CAUSAL)).sum()) * s * (s + 1) // 2
    pool_bits = table.pool.reshape(len(table.pool), -1).sum(1)
    partial = int(pool_bits[table.pattern[table.types == int(BlockType.PARTIAL)]].sum())
    return full + causal + partial


def _block_table_mask_mod(table: BlockTable, device) -> Callable[..., torch.Tensor]:
    types = torch.from_numpy(table.types).to(device)
    pattern = torch.from_numpy(table.pattern).to(device)
    pool = torch.from_numpy(table.pool).to(device)
    size = table.size

    def mask_mod(b, h, q_idx, kv_idx):
        kind = types[q_idx // size, kv_idx // size]
        bit = pool[pattern[q_idx // size, kv_idx // size].clamp(min=0), q_idx % size, kv_idx % size]
        return ((kind == int(BlockType.FULL)) | ((kind == int(BlockType.CAUSAL)) & (q_idx >= kv_idx))
                | ((kind == int(BlockType.PARTIAL)) & bit))

    return mask_mod


def collator_samples(layout: Layout, vocab: int = 32000, seed: int = 0) -> list[dict]:
    """The layout's documents as `OmniCollator` samples (``input_ids``, ``modality_spans`` per document),
    which ``OmniCollator(mode="pack", max_length=S)`` packs back into the layout's one row."""
    rng = np.random.default_rng(seed)
    starts = np.flatnonzero(np.r_[True, layout.doc[1:] != layout.doc[:-1]])
    samples = []
    for start, end in zip(starts.tolist(), np.r_[starts[1:], layout.seq_len].tolist()):
        grp = layout.grp[start:end]
        first = np.flatnonzero((grp >= 0) & np.r_[True, grp[1:] != grp[:-1]])
        last = np.flatnonzero((grp >= 0) & np.r_[grp[:-1] != grp[1:], True]) + 1
        samples.append({"input_ids": torch.from_numpy(rng.integers(0, vocab, end - start)),
                        "modality_spans": list(zip(first.tolist(), last.tolist()))})
    return samples
