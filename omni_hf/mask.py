"""Typed block masks for omni attention: `BlockType`, `OmniBlockMask` and its builders.

A mask is stored per (Q block, KV block) pair as one of four types, so a kernel skips what is masked
and runs unmasked tiles with no mask code. The element rule every builder, the reference and every
kernel share (see `csrc/omni_attention.h`): for query row ``i`` (absolute position
``qpos = i + kv_len - q_len``) and key ``j``, with ``qb = i // block_q`` and ``kb = j // block_kv``:

- ``kb`` absent from the active blocks of row ``qb``: not allowed (MASKED);
- FULL: allowed;  CAUSAL: allowed iff ``qpos >= j``;
- PARTIAL with a pool index ``p >= 0``: bit ``j % block_kv`` of row ``i % block_q`` of pattern ``p``;
- PARTIAL with ``p == -1``: the token rule over per-token ``doc`` and ``grp`` ids,
  ``doc[qpos] >= 0 and doc[qpos] == doc[j] and ((j <= qpos and qpos - j < window)
  or (grp[qpos] >= 0 and grp[qpos] == grp[j]))``.

Rows past ``q_len`` and keys past ``kv_len`` are never allowed.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .token_ranges import token_ranges

__all__ = ["BlockType", "MaskKind", "OmniBlockMask", "token_ids_from_spans"]

BLOCK_SIZES = (64, 128)
_INT32_MAX = torch.iinfo(torch.int32).max
_DENSE_CHUNK_ELEMENTS = 1 << 24  # elements of one row chunk when a dense mask is evaluated


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
_MASKED, _FULL, _CAUSAL, _PARTIAL = (int(t) for t in BlockType)
_PICTURE = {BlockType.MASKED: ".", BlockType.FULL: "F", BlockType.CAUSAL: "C", BlockType.PARTIAL: "P"}


@dataclasses.dataclass(frozen=True)
class OmniBlockMask:
    """A block-sparse attention mask with typed blocks.

    Leading dims ``B`` and ``H`` of every list may be 1 and then broadcast over the batch / query heads.
    ``nQ = ceil(q_len / block_q)``, ``nK = ceil(kv_len / block_kv)``; builders use ``maxK = nK`` and
    ``maxQ = nQ`` so that shapes never depend on the data. Implicit masks (``kind`` CAUSAL or FULL, from
    `causal` and `full`) hold no tensors: every list, the pool and the ids are None.

    Attributes:
        kv_num_blocks: int32 ``[B, H, nQ]``, active KV blocks of each Q block (row view).
        kv_indices: int32 ``[B, H, nQ, maxK]``, their indices, ascending; entries past the count are ignored.
        kv_types: int8 ``[B, H, nQ, maxK]``, the `BlockType` of each entry.
        kv_partial: int32 ``[B, H, nQ, maxK]``, index into ``partial_pool``, -1 unless a pooled PARTIAL.
        q_num_blocks, q_indices, q_types, q_partial: the same lists per KV block (column view, for dK/dV).
        partial_pool: int32 ``[P, block_q, block_kv // 32]``, deduplicated bit patterns of PARTIAL blocks;
            bit ``j`` of word ``w`` is key ``w * 32 + j`` of the block.
        q_len, kv_len: query and key lengths.
        block_q, block_kv: block sizes, 64 or 128 each.
        doc_ids, group_ids: int32 ``[B, kv_len]`` per-token ids for token-rule PARTIAL blocks, or None.
        window: sliding window of the causal part (token rule, or an implicit CAUSAL mask), or None.
        kind: `MaskKind`, BLOCKS unless the mask is implicit.
        token_ranges: int32 ``[B, kv_len, 4]``, the token rule of each position as ranges
            (`omni_hf.token_ranges.token_ranges` of the ids and window), which the CUDA kernels test instead of
            the ids where the ids allow it; set by `from_token_ids`, None elsewhere (the kernels compare ids).
    """

    kv_num_blocks: torch.Tensor | None
    kv_indices: torch.Tensor | None
    kv_types: torch.Tensor | None
    kv_partial: torch.Tensor | None
    q_num_blocks: torch.Tensor | None
    q_indices: torch.Tensor | None
    q_types: torch.Tensor | None
    q_partial: torch.Tensor | None
    partial_pool: torch.Tensor | None
    q_len: int
    kv_len: int
    block_q: int = 128
    block_kv: int = 128
    doc_ids: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    window: int | None = None
    kind: MaskKind = MaskKind.BLOCKS
    token_ranges: torch.Tensor | None = None

    # ------------------------------------------------------------------ sizes

    @property
    def implicit(self) -> bool:
        """True for masks that sizes describe (kind CAUSAL or FULL): no tensors, any device."""
        return self.kind != MaskKind.BLOCKS

    @property
    def batch(self) -> int:
        """Leading batch dim of the lists (1 when the mask broadcasts over the batch)."""
        return 1 if self.implicit else self.kv_num_blocks.shape[0]

    @property
    def heads(self) -> int:
        """Leading head dim of the lists (1 when the mask broadcasts over the query heads)."""
        return 1 if self.implicit else self.kv_num_blocks.shape[1]

    @property
    def num_q_blocks(self) -> int:
        return -(-self.q_len // self.block_q)

    @property
    def num_kv_blocks(self) -> int:
        return -(-self.kv_len // self.block_kv)

    @property
    def device(self) -> torch.device | None:
        """The device of the lists; None for an implicit mask, which serves every device."""
        return None if self.implicit else self.kv_num_blocks.device

    # ------------------------------------------------------------------ builders

    @classmethod
    def causal(
        cls,
        q_len: int,
        kv_len: int | None = None,
        *,
        block_q: int = 128,
        block_kv: int = 128,
        window: int | None = None,
    ) -> OmniBlockMask:
        """Causal mask with bottom-right alignment (query ``i`` sees keys ``j <= i + kv_len - q_len``).

        With ``window``, keys must also satisfy ``qpos - j < window``. Implicit (`MaskKind.CAUSAL`): nothing is
        built, on any device; the kernels derive every block from its position.
        """
        return cls._implicit(MaskKind.CAUSAL, q_len, kv_len, block_q, block_kv, window)

    @classmethod
    def full(cls, q_len: int, kv_len: int | None = None, *, block_q: int = 128, block_kv: int = 128) -> OmniBlockMask:
        """Every query sees every key (bidirectional attention, e.g. a vision tower). Implicit
        (`MaskKind.FULL`): nothing is built, on any device."""
        return cls._implicit(MaskKind.FULL, q_len, kv_len, block_q, block_kv, None)

    @classmethod
    def _implicit(cls, kind: MaskKind, q_len: int, kv_len: int | None, block_q: int, block_kv: int,
                  window: int | None) -> OmniBlockMask:
        kv_len = q_len if kv_len is None else kv_len
        _check_sizes(q_len, kv_len, block_q, block_kv)
        _check_window(window)
        return cls(*(None,) * len(_TENSOR_FIELDS), q_len, kv_len, block_q, block_kv, window=window, kind=kind)

    @classmethod
    def from_token_ids(
        cls,
        doc_ids: torch.Tensor,
        group_ids: torch.Tensor | None = None,
        *,
        q_len: int | None = None,
        block_q: int = 128,
        block_kv: int = 128,
        window: int | None = None,
    ) -> OmniBlockMask:
        """Token-rule mask from per-token ids: the VLM fast path, O(S) metadata and no pool.

        Args:
            doc_ids: int ``[B, kv_len]`` (or ``[kv_len]``): the packed sample of each token, -1 = padding.
            group_ids: int, same shape: the bidirectional group (image) of each token, -1 = causal text.
                None means all text. A batch of 1 in either broadcasts over the other's batch.
            q_len: number of query rows, the last ``q_len`` positions (default ``kv_len``).
            window: optional sliding window for the causal part (``qpos - j < window``).

        Block summaries (min / max of doc and group per block) classify each block pair; fixed output
        shapes and no host sync. The mask also carries `token_ranges`, each position's allowed keys as one range
        where the ids allow it (ids increasing along the row, one run each: as the collator numbers them), which
        the CUDA kernels test instead of comparing ids. On a GPU with the CUDA library loaded this is four kernel
        launches (``omni_build_token_mask``); elsewhere, under ``torch.compile`` tracing, or with
        ``OMNI_HF_BACKEND=reference``, vectorised PyTorch ops give the same tensors.
        """
        doc_ids, group_ids = _check_token_ids(doc_ids, group_ids)
        kv_len = doc_ids.shape[1]
        q_len = kv_len if q_len is None else q_len
        _check_sizes(q_len, kv_len, block_q, block_kv)
        if q_len > kv_len:
            raise ValueError(f"q_len: expected at most kv_len={kv_len} for a token-rule mask, got {q_len}")
        _check_window(window)
        pool = _empty_pool(block_q, block_kv, doc_ids.device)
        token_rule = dict(doc_ids=doc_ids, group_ids=group_ids, window=window)
        if _library_builds_token_masks(doc_ids):
            from . import _cuda

            *lists, ranges = _cuda.token_mask(doc_ids, group_ids, q_len, block_q, block_kv, window)
            return cls(*lists, pool, q_len, kv_len, block_q, block_kv, token_ranges=ranges, **token_rule)
        types = _classify_token_blocks(doc_ids, group_ids, q_len, block_q, block_kv, window)
        return cls._from_block_table(types[:, None], None, pool, q_len, kv_len, block_q, block_kv,
                                     token_ranges=token_ranges(doc_ids, group_ids, window), **token_rule)

    @classmethod
    def from_key_padding(
        cls,
        key_padding: torch.Tensor,
        q_len: int | None = None,
        *,
        block_q: int = 128,
        block_kv: int = 128,
    ) -> OmniBlockMask:
        """Bidirectional attention over the real keys: every query row sees every key where ``key_padding`` is
        True. Query rows are never masked, so this serves cross-attention as well as encoders (whose padding rows
        then attend like sdpa's); the token rule would instead read each query's padding from the keys.

        Args:
            key_padding: bool ``[B, kv_len]`` (or ``[kv_len]``), True = a real key.
            q_len: number of query rows (default ``kv_len``); any value, unrelated to the keys.

        Key blocks are FULL, absent, or PARTIAL with the block's key pattern in the pool (one pool entry per
        batch row and key block, so shapes depend on sizes only: no host sync). O(B * kv_len * block_q / 32).
        """
        if not isinstance(key_padding, torch.Tensor) or key_padding.dtype != torch.bool:
            raise TypeError(f"key_padding: expected a bool tensor, got {_describe_value(key_padding)}")
        if key_padding.dim() == 1:
            key_padding = key_padding[None]
        if key_padding.dim() != 2 or key_padding.shape[1] == 0:
            raise ValueError(f"key_padding: expected shape [B, kv_len] or [kv_len], got {tuple(key_padding.shape)}")
        batch, kv_len = key_padding.shape
        q_len = kv_len if q_len is None else q_len
        _check_sizes(q_len, kv_len, block_q, block_kv)
        num_q, num_kv = -(-q_len // block_q), -(-kv_len // block_kv)
        keys = torch.nn.functional.pad(key_padding, (0, num_kv * block_kv - kv_len)).view(batch, num_kv, block_kv)
        real = keys.sum(-1)
        in_range = torch.full((num_kv,), block_kv, device=keys.device)
        in_range[-1] = kv_len - (num_kv - 1) * block_kv
        full, masked = real == in_range, real == 0
        kinds = _block_type(masked, full, torch.zeros_like(full))  # [B, nK]: FULL, MASKED or PARTIAL
        words = _pack_patterns(keys.reshape(batch * num_kv, 1, block_kv), 1, block_kv)  # [B * nK, block_kv / 32]
        pool = words[:, None].expand(-1, block_q, -1).contiguous()
        entry = torch.arange(batch * num_kv, dtype=torch.int32, device=keys.device).view(batch, num_kv)
        pool_ids = torch.where(kinds == _PARTIAL, entry, -1)
        table = (kinds[:, None, None].expand(batch, 1, num_q, num_kv).contiguous(),
                 pool_ids[:, None, None].expand(batch, 1, num_q, num_kv).contiguous())
        return cls._from_block_table(*table, pool, q_len, kv_len, block_q, block_kv)

    @classmethod
    def from_spans(
        cls,
        spans: Sequence[Sequence[tuple[int, int]]],
        seq_len: int,
        *,
        sample_lengths: Sequence[Sequence[int]] | None = None,
        block_q: int = 128,
        block_kv: int = 128,
        device: torch.device | str | None = None,
    ) -> OmniBlockMask:
        """Interleaved text / image mask from per-row bidirectional spans.

        Args:
            spans: for each batch row, sorted non-overlapping ``(start, end)`` token ranges (end
                exclusive, positions within the row) that attend to each other both ways, e.g. the
                patch tokens of each image. Everything else is causal text.
            seq_len: length of every row.
            sample_lengths: for each row, the lengths of the samples packed into it (they never see each
                other; what is left of the row is padding). Default: one sample filling the row.
        """
        doc_ids, group_ids = token_ids_from_spans(spans, seq_len, sample_lengths)
        return cls.from_token_ids(torch.from_numpy(doc_ids).to(device), torch.from_numpy(group_ids).to(device),
                                  block_q=block_q, block_kv=block_kv)

    @classmethod
    def from_dense(cls, dense: torch.Tensor, *, block_q: int = 128, block_kv: int = 128) -> OmniBlockMask:
        """Classify a dense bool mask ``[q_len, kv_len]`` or ``[B|1, H|1, q_len, kv_len]`` (True = allowed).

        Blocks are classified tightest: all allowed -> FULL, exactly the causal triangle -> CAUSAL,
        none -> absent, anything else -> PARTIAL with its bit pattern in the pool.
        """
        if not isinstance(dense, torch.Tensor) or dense.dtype != torch.bool:
            raise TypeError(f"dense: expected a bool tensor, got {_describe_value(dense)}")
        if dense.dim() == 2:
            dense = dense[None, None]
        if dense.dim() != 4:
            raise ValueError(f"dense: expected shape [q_len, kv_len] or [B, H, q_len, kv_len], got {tuple(dense.shape)}")
        batch, heads, q_len, kv_len = dense.shape
        return cls._from_row_function(lambda start, stop: dense[:, :, start:stop], batch, heads, q_len, kv_len,
                                      block_q, block_kv, dense.device)

    @classmethod
    def from_mask_fn(
        cls,
        mask_mod: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        q_len: int,
        kv_len: int | None = None,
        *,
        batch: int = 1,
        heads: int = 1,
        block_q: int = 128,
        block_kv: int = 128,
        device: torch.device | str | None = None,
    ) -> OmniBlockMask:
        """Classify a FlexAttention-style ``mask_mod(b, h, q_idx, kv_idx) -> bool`` tile row by tile row.

        ``mask_mod`` receives broadcastable int64 index tensors (``q_idx`` is the query row, 0 to
        ``q_len - 1``, as in FlexAttention) and must return a broadcastable bool tensor. It is evaluated
        on a few block rows at a time, never on the whole ``q_len x kv_len`` grid at once.
        """
        kv_len = q_len if kv_len is None else kv_len
        device = torch.device(device or "cpu")
        b = torch.arange(batch, device=device)[:, None, None, None]
        h = torch.arange(heads, device=device)[None, :, None, None]
        kv = torch.arange(kv_len, device=device)[None, None, None, :]

        def rows(start: int, stop: int) -> torch.Tensor:
            q = torch.arange(start, stop, device=device)[None, None, :, None]
            return torch.as_tensor(mask_mod(b, h, q, kv), device=device).expand(batch, heads, stop - start, kv_len)

        return cls._from_row_function(rows, batch, heads, q_len, kv_len, block_q, block_kv, device)

    @classmethod
    def from_flex(cls, block_mask, *, block_q: int = 128, block_kv: int = 128) -> OmniBlockMask:
        """Convert a `torch.nn.attention.flex_attention.BlockMask` (its exact element-wise semantics:
        Flex's full blocks allowed, its partial blocks where ``mask_mod`` allows, the rest masked)."""
        q_len, kv_len = block_mask.seq_lengths
        flex_q, flex_kv = block_mask.BLOCK_SIZE
        partial = _flex_block_table(block_mask.kv_num_blocks, block_mask.kv_indices, kv_len, flex_kv)
        full = (_flex_block_table(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, kv_len, flex_kv)
                if block_mask.full_kv_num_blocks is not None else torch.zeros_like(partial))
        batch, heads = partial.shape[:2]
        device = partial.device
        b = torch.arange(batch, device=device)[:, None, None, None]
        h = torch.arange(heads, device=device)[None, :, None, None]
        kv = torch.arange(kv_len, device=device)[None, None, None, :]

        def rows(start: int, stop: int) -> torch.Tensor:
            q = torch.arange(start, stop, device=device)[None, None, :, None]
            qb, kb = q // flex_q, kv // flex_kv
            allowed = block_mask.mask_mod(b, h, q, kv) & partial[b, h, qb, kb]
            return (allowed | full[b, h, qb, kb]).expand(batch, heads, stop - start, kv_len)

        return cls._from_row_function(rows, batch, heads, q_len, kv_len, block_q, block_kv, device)

    # ------------------------------------------------------------------ views and conversions

    def mask_mod(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        """The element rule as a FlexAttention-style ``mask_mod(b, h, q_idx, kv_idx) -> bool``.

        Takes broadcastable int index tensors (``q_idx`` is the query row, 0 to ``q_len - 1``), all in
        range; ``b`` and ``h`` are clamped to 0 where the mask broadcasts. This is `to_flex`'s mask_mod.
        """
        if self.implicit:
            return lambda b, h, q_idx, kv_idx: self._implicit_rule(q_idx, kv_idx)
        types, partial = self.block_table()

        def mask_mod(b, h, q_idx, kv_idx):
            b, h = b * (self.batch > 1), h * (self.heads > 1)
            qb, kb = q_idx // self.block_q, kv_idx // self.block_kv
            return self._rule(types[b, h, qb, kb], partial[b, h, qb, kb], b, q_idx, kv_idx)

        return mask_mod

    def _implicit_rule(self, q_idx, kv_idx) -> torch.Tensor:
        """The element rule of an implicit mask (broadcastable index tensors; keys in range)."""
        if self.kind == MaskKind.FULL:
            return torch.ones_like(q_idx + kv_idx, dtype=torch.bool)
        qpos = q_idx + (self.kv_len - self.q_len)
        allowed = kv_idx <= qpos
        return allowed if self.window is None else allowed & (qpos - kv_idx < self.window)

    def _rule(self, kind, pool_id, b, q_idx, kv_idx) -> torch.Tensor:
        """The element rule given each element's block type and pool id (broadcastable tensors)."""
        qpos = q_idx + (self.kv_len - self.q_len)
        result = (kind == _FULL) | ((kind == _CAUSAL) & (qpos >= kv_idx))
        is_partial = kind == _PARTIAL
        if self.partial_pool.shape[0] > 0:
            jj = kv_idx % self.block_kv
            word = self.partial_pool[pool_id.clamp(min=0), q_idx % self.block_q, jj // 32]
            result = result | (is_partial & (pool_id >= 0) & ((word >> (jj % 32)) & 1).bool())
        if self.doc_ids is not None:
            doc, grp = self.doc_ids, self.group_ids
            bd, qpos_safe = b * (doc.shape[0] > 1), qpos.clamp(min=0)
            q_doc, q_grp = doc[bd, qpos_safe], grp[bd, qpos_safe]
            near = kv_idx <= qpos
            if self.window is not None:
                near = near & (qpos - kv_idx < self.window)
            token = (q_doc >= 0) & (q_doc == doc[bd, kv_idx]) & (near | ((q_grp >= 0) & (q_grp == grp[bd, kv_idx])))
            result = result | (is_partial & (pool_id < 0) & token)
        return result

    def dense_rows(self, start: int, stop: int, device: torch.device | str | None = None) -> torch.Tensor:
        """The dense bool mask of query rows ``start:stop``: ``[B, H, stop - start, kv_len]``, on the mask's
        device (``device``, default CPU, for an implicit mask)."""
        if self.implicit:
            q = torch.arange(start, stop, device=device)[:, None]
            return self._implicit_rule(q, torch.arange(self.kv_len, device=device)[None])[None, None]
        device = self.device
        b = torch.arange(self.batch, device=device)[:, None, None, None]
        q = torch.arange(start, stop, device=device)
        kv = torch.arange(self.kv_len, device=device)
        types, partial = self.block_table()
        qb, kb = q // self.block_q, kv // self.block_kv
        kind = types[:, :, qb].index_select(-1, kb)  # [B, H, rows, kv_len]
        pool_id = partial[:, :, qb].index_select(-1, kb)
        allowed = self._rule(kind, pool_id, b, q[:, None], kv[None, :])
        return allowed.expand(self.batch, self.heads, stop - start, self.kv_len)

    def to_dense(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The whole dense bool mask ``[B, H, q_len, kv_len]`` (for tests and small sizes only; ``device`` as in
        `dense_rows`)."""
        return self.dense_rows(0, self.q_len, device)

    def block_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense per-block view: types int8 ``[B, H, nQ, nK]`` and pool ids int32 (-1 where none); on the CPU
        for an implicit mask, whose blocks are those the kernels derive (`_implicit_block_table`)."""
        if self.implicit:
            return _implicit_block_table(self)
        return _table_from_lists(self.kv_num_blocks, self.kv_indices, self.kv_types, self.kv_partial,
                                 self.num_kv_blocks)

    def to_flex(self):
        """Convert to a `torch.nn.attention.flex_attention.BlockMask` with the same element rule.

        FULL blocks become Flex's full blocks, CAUSAL and PARTIAL its partial blocks, whose
        ``mask_mod`` is `mask_mod`.
        """
        from torch.nn.attention.flex_attention import BlockMask

        types, _ = self.block_table()
        partial_num, partial_idx = _lists_from_table(((types == _CAUSAL) | (types == _PARTIAL)))
        full_num, full_idx = _lists_from_table(types == _FULL)
        return BlockMask.from_kv_blocks(partial_num, partial_idx, full_num, full_idx,
                                        BLOCK_SIZE=(self.block_q, self.block_kv), mask_mod=self.mask_mod(),
                                        seq_lengths=(self.q_len, self.kv_len))

    def describe(self, b: int = 0, h: int = 0) -> str:
        """A picture of one (batch, head) slice: one line per Q block, one character per KV block
        (``F`` full, ``C`` causal, ``P`` partial, ``.`` masked), after a summary line."""
        types, _ = self.block_table()
        grid = types[min(b, self.batch - 1), min(h, self.heads - 1)].cpu().tolist()
        counts = {kind: sum(row.count(kind) for row in grid) for kind in BlockType}
        header = (f"OmniBlockMask q_len={self.q_len} kv_len={self.kv_len} blocks={self.block_q}x{self.block_kv} "
                  f"B={self.batch} H={self.heads} (showing b={b} h={h}): "
                  + " ".join(f"{_PICTURE[kind]}={counts[kind]}" for kind in BlockType)
                  + f" partial_pool={0 if self.implicit else self.partial_pool.shape[0]}")
        return "\n".join([header] + ["".join(_PICTURE[BlockType(t)] for t in row) for row in grid])

    def __str__(self) -> str:
        return self.describe()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> OmniBlockMask:
        """Move every tensor to ``device`` (like `torch.Tensor.to`)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> OmniBlockMask:
        """Copy every tensor into pinned host memory, for ``to(cuda, non_blocking=True)``."""
        return self._map(torch.Tensor.pin_memory)

    def validate(self) -> None:
        """Check the structure and raise ValueError saying what is wrong (syncs with the device)."""
        _validate(self)

    # ------------------------------------------------------------------ internals

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> OmniBlockMask:
        changes = {f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self)
                   if isinstance(getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, **changes)

    @classmethod
    def _from_block_table(cls, types, partial, pool, q_len, kv_len, block_q, block_kv, **token_rule) -> OmniBlockMask:
        """Build both views from a dense block table: types int8 ``[B, H, nQ, nK]``, pool ids or None."""
        row = _block_lists(types, partial)
        col = _block_lists(types.transpose(-1, -2).contiguous(),
                           None if partial is None else partial.transpose(-1, -2).contiguous())
        return cls(*row, *col, pool, q_len, kv_len, block_q, block_kv, **token_rule)

    @classmethod
    def _from_row_function(cls, rows, batch, heads, q_len, kv_len, block_q, block_kv, device) -> OmniBlockMask:
        """Classify a dense mask given as ``rows(start, stop) -> bool [B, H, stop - start, kv_len]``,
        a few block rows at a time (about `_DENSE_CHUNK_ELEMENTS` mask elements per call, read at each call
        so that tests can shrink it).

        Each chunk's PARTIAL patterns are bit-packed and numbered where they lie in the chunk's own block
        table, so the pool ids land on the right blocks whatever the batch, heads and chunking.
        """
        _check_sizes(q_len, kv_len, block_q, block_kv)
        nq = -(-q_len // block_q)
        chunk = max(1, _DENSE_CHUNK_ELEMENTS // max(1, batch * heads * block_q * kv_len))
        types, pattern_ids, words, count = [], [], [], 0
        for first in range(0, nq, chunk):
            start, stop = first * block_q, min((first + chunk) * block_q, q_len)
            t, p = _classify_dense_rows(rows(start, stop), start, q_len, kv_len, block_q, block_kv)
            ids = torch.full(t.shape, -1, dtype=torch.int64, device=device)
            ids[t == _PARTIAL] = torch.arange(count, count + p.shape[0], device=device)
            types.append(t)
            pattern_ids.append(ids)
            words.append(_pack_patterns(p, block_q, block_kv))
            count += p.shape[0]
        types, pattern_ids = torch.cat(types, dim=2), torch.cat(pattern_ids, dim=2)
        pool, pool_ids = _dedupe_words(torch.cat(words), block_q, block_kv, device)
        partial = torch.full(types.shape, -1, dtype=torch.int32, device=device)
        pooled = pattern_ids >= 0
        partial[pooled] = pool_ids[pattern_ids[pooled]].to(torch.int32)
        return cls._from_block_table(types, partial, pool, q_len, kv_len, block_q, block_kv)

    def _op_args(self) -> tuple[list[torch.Tensor | None], list[int]]:
        """Flatten into tensors and ints for the ops (inverse: `_from_op_args`)."""
        tensors = [getattr(self, name) for name in _TENSOR_FIELDS] + [self.doc_ids, self.group_ids, self.token_ranges]
        ints = [self.q_len, self.kv_len, self.block_q, self.block_kv, self.window or 0, int(self.kind)]
        return tensors, ints

    @classmethod
    def _from_op_args(cls, tensors: Sequence[torch.Tensor | None], ints: Sequence[int]) -> OmniBlockMask:
        q_len, kv_len, block_q, block_kv, window, kind = ints
        fields = dict(zip(_TENSOR_FIELDS, tensors))
        return cls(**fields, q_len=q_len, kv_len=kv_len, block_q=block_q, block_kv=block_kv,
                   doc_ids=tensors[-3], group_ids=tensors[-2], token_ranges=tensors[-1], window=window or None,
                   kind=MaskKind(kind))


_TENSOR_FIELDS = ("kv_num_blocks", "kv_indices", "kv_types", "kv_partial", "q_num_blocks", "q_indices", "q_types",
                  "q_partial", "partial_pool")


# ---------------------------------------------------------------------- block lists


def _block_lists(types: torch.Tensor, partial: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Row-view lists from a block table ``[B, H, nRows, nCols]``: num, indices, types, pool ids.

    Fixed shapes (``maxBlocks = nCols``), no host sync: the active columns come first, ascending.
    ``partial`` None means no pooled blocks (all -1).
    """
    num, order = _lists_from_table(types != _MASKED)
    listed = order.long()
    pool_ids = (torch.full(order.shape, -1, dtype=torch.int32, device=order.device) if partial is None
                else partial.gather(-1, listed).to(torch.int32).contiguous())
    return num, order, types.gather(-1, listed).contiguous(), pool_ids


def _lists_from_table(active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 counts and column indices, active columns first and ascending, of a bool table ``[..., nC]``.

    A stable partition by a cumulative sum (no sort): active column c goes to slot ``#active before c``;
    inactive columns all go to a spare slot ``nC`` that is dropped, so entries past the count are 0.
    Elementwise ops only with scalars: broadcasting integer ops are slow on the CPU.
    """
    columns = active.shape[-1]
    flag = active.to(torch.int32)
    rank = flag.cumsum(-1, dtype=torch.int32)  # active columns up to and including c
    slot = (rank - (columns + 1)) * flag + columns
    index = torch.arange(columns, dtype=torch.int32, device=active.device).expand(active.shape)
    order = torch.zeros(*active.shape[:-1], columns + 1, dtype=torch.int32, device=active.device)
    order.scatter_(-1, slot.long(), index)
    return rank[..., -1].contiguous(), order[..., :columns].contiguous()


def _table_from_lists(num, indices, types, partial, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `_block_lists`: types int8 and pool ids int32 ``[B, H, nRows, columns]``."""
    return (_scatter_lists(num, indices, types.to(torch.int8), columns, fill=0),
            _scatter_lists(num, indices, partial.to(torch.int32), columns, fill=-1))


def _flex_block_table(num: torch.Tensor, indices: torch.Tensor, kv_len: int, block_kv: int) -> torch.Tensor:
    """bool ``[B, H, nQ, nK]``: which blocks a Flex list marks active."""
    return _scatter_lists(num, indices, torch.ones_like(indices, dtype=torch.bool), -(-kv_len // block_kv), fill=False)


def _scatter_lists(num, indices, values: torch.Tensor, columns: int, fill) -> torch.Tensor:
    """Each row's active list entries ``values`` placed at their column of a ``[..., columns]`` table, ``fill``
    elsewhere; inactive entries land in a spare column that is dropped."""
    active = torch.arange(indices.shape[-1], device=indices.device) < num[..., None]
    column = torch.where(active, indices.long(), columns)
    table = torch.full((*indices.shape[:-1], columns + 1), fill, dtype=values.dtype, device=values.device)
    return table.scatter_(-1, column, values)[..., :columns]


# ---------------------------------------------------------------------- dense classification


def _classify_dense_rows(dense, start, q_len, kv_len, block_q, block_kv) -> tuple[torch.Tensor, torch.Tensor]:
    """Classify the blocks of dense rows ``start:start+R`` (``start`` a multiple of ``block_q``).

    Args:
        dense: bool ``[B, H, R, kv_len]``.
    Returns:
        types int8 ``[B, H, ceil(R / block_q), nK]`` and the bool patterns ``[n, block_q, block_kv]`` of
        the PARTIAL blocks in row-major block order.
    """
    batch, heads, rows, _ = dense.shape
    nq, nk = -(-rows // block_q), -(-kv_len // block_kv)
    padded = torch.zeros(batch, heads, nq * block_q, nk * block_kv, dtype=torch.bool, device=dense.device)
    padded[:, :, :rows, :kv_len] = dense
    tiles = padded.view(batch, heads, nq, block_q, nk, block_kv).transpose(3, 4)
    row = torch.arange(start, start + nq * block_q, device=dense.device).view(nq, 1, block_q, 1)
    col = torch.arange(nk * block_kv, device=dense.device).view(1, nk, 1, block_kv)
    valid = (row < q_len) & (col < kv_len)
    causal = valid & (row + (kv_len - q_len) >= col)
    allowed = tiles.sum((-1, -2))
    is_full = allowed == valid.sum((-1, -2))
    is_causal = (tiles == causal).all(-1).all(-1)
    types = torch.where(allowed == 0, _MASKED,
                        torch.where(is_full, _FULL, torch.where(is_causal, _CAUSAL, _PARTIAL))).to(torch.int8)
    return types, tiles[types == _PARTIAL]


def _empty_pool(block_q: int, block_kv: int, device) -> torch.Tensor:
    return torch.zeros(0, block_q, block_kv // 32, dtype=torch.int32, device=device)


def _pack_patterns(patterns: torch.Tensor, block_q: int, block_kv: int) -> torch.Tensor:
    """Bit-pack bool patterns ``[n, block_q, block_kv]`` into int32 words ``[n, block_q * block_kv // 32]``
    (bit ``j`` of word ``w`` of a row is key ``w * 32 + j``)."""
    bits = patterns.reshape(-1, block_q, block_kv // 32, 32).to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=patterns.device) << torch.arange(32, device=patterns.device)
    weights[31] = -(1 << 31)  # two's complement: bit 31 is the sign bit of an int32 word
    return (bits * weights).sum(-1).to(torch.int32).view(patterns.shape[0], block_q * block_kv // 32)


def _dedupe_words(words: torch.Tensor, block_q, block_kv, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Deduplicate packed patterns ``[n, block_q * block_kv // 32]``.

    Returns the pool int32 ``[P, block_q, block_kv // 32]`` and each pattern's pool id int64 ``[n]``.
    """
    if words.shape[0] == 0:
        return _empty_pool(block_q, block_kv, device), torch.zeros(0, dtype=torch.int64, device=device)
    pool, inverse = torch.unique(words, dim=0, return_inverse=True)
    return pool.view(-1, block_q, block_kv // 32).contiguous(), inverse


# ---------------------------------------------------------------------- token rule classification


class _BlockPositions:
    """Absolute first / last positions of every Q block and KV block, as broadcastable ``[nQ, nK]``
    comparisons (query positions bottom-right aligned)."""

    def __init__(self, q_len: int, kv_len: int, block_q: int, block_kv: int, device: torch.device):
        offset = kv_len - q_len
        q_start = torch.arange(0, q_len, block_q, dtype=torch.int32, device=device)
        k_start = torch.arange(0, kv_len, block_kv, dtype=torch.int32, device=device)
        self.q_first = (q_start + offset)[:, None]
        self.q_last = ((q_start + block_q).clamp(max=q_len) - 1 + offset)[:, None]
        self.k_first = k_start[None, :]
        self.k_last = ((k_start + block_kv).clamp(max=kv_len) - 1)[None, :]
        self.all_before = self.k_last <= self.q_first  # every key at or before every query
        self.all_after = self.k_first > self.q_last  # every key after every query


class _TokenSummary:
    """Per-block summaries of doc / group ids, each ``[B, nBlocks]`` int32.

    ``*_min`` is the least non-negative id of the block (INT32_MAX if none), ``*_max`` the greatest id,
    so a block with no real token has ``min > max`` and range-overlap tests need no emptiness check;
    ``*_key`` equals another block's key iff both blocks hold one and the same id >= 0 (see `_id_summary`).
    Group ids count only on real tokens (``doc >= 0``). The last block's tail repeats its last token,
    which changes no summary. Written as plain integer ops: ``torch.where`` / ``masked_fill`` are slow
    on the CPU at these sizes.
    """

    def __init__(self, doc: torch.Tensor, grp: torch.Tensor, block: int, side: int):
        batch, length = doc.shape
        n = -(-length // block)
        tail = n * block - length
        grp = grp | (doc >> 31)  # -1 wherever doc is padding (arithmetic shift of a negative int32)
        doc, grp = (torch.cat([x, x[:, -1:].expand(batch, tail)], 1).view(batch, n, block) for x in (doc, grp))
        self.doc_min, self.doc_max, self.doc_key = _id_summary(doc, side)
        self.grp_min, self.grp_max, self.grp_key = _id_summary(grp, side)


def _id_summary(ids: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Least non-negative id, greatest id, and a key that is the block's one id when all its ids are
    one value >= 0, else a negative number no other block's key equals (``side`` 0 for query blocks,
    1 for key blocks), so that one comparison of keys tells "both blocks are all this one id".

    ``ids & INT32_MAX`` turns -1 into INT32_MAX, above every real id (int32 throughout: int64
    reductions are several times slower on the CPU).
    """
    least = (ids & _INT32_MAX).amin(-1)
    greatest = ids.amax(-1)
    single = (ids.amin(-1) == greatest) & (greatest >= 0)
    unique = -1 - side - 2 * torch.arange(ids.shape[1], dtype=torch.int32, device=ids.device)
    return least, greatest, torch.where(single, greatest, unique)


def _classify_token_blocks(doc, grp, q_len, block_q, block_kv, window) -> torch.Tensor:
    """int8 block types ``[B, nQ, nK]`` of the token rule, from block summaries (nothing S x S).

    Sound: FULL and CAUSAL are claimed only where they hold for every in-range pair, MASKED only
    where no pair is allowed; the rest is PARTIAL and the kernel applies the token rule there.
    """
    kv_len = doc.shape[1]
    pos = _BlockPositions(q_len, kv_len, block_q, block_kv, doc.device)
    qs = _TokenSummary(doc[:, kv_len - q_len:], grp[:, kv_len - q_len:], block_q, side=0)
    ks = _TokenSummary(doc, grp, block_kv, side=1)

    def q(name):
        return getattr(qs, name)[:, :, None]

    def k(name):
        return getattr(ks, name)[:, None, :]

    docs_overlap = (q("doc_min") <= k("doc_max")) & (k("doc_min") <= q("doc_max"))
    groups_overlap = (q("grp_min") <= k("grp_max")) & (k("grp_min") <= q("grp_max"))
    one_doc = q("doc_key") == k("doc_key")
    one_group = q("grp_key") == k("grp_key")
    if window is None:
        window_holds, window_fails = True, False
    else:
        window_holds = pos.q_last - pos.k_first < window  # every pair inside the window
        window_fails = pos.q_first - pos.k_last >= window  # no pair inside the window
    masked = ~docs_overlap | ((pos.all_after | window_fails) & ~groups_overlap)
    full = one_doc & ((pos.all_before & window_holds) | one_group)
    causal = one_doc & window_holds & ~groups_overlap
    return _block_type(masked, full, causal)


def _implicit_block_table(mask: OmniBlockMask) -> tuple[torch.Tensor, torch.Tensor]:
    """types int8 ``[1, 1, nQ, nK]`` and pool ids (all -1) of an implicit mask: the blocks the kernels derive
    (csrc/common/mask_rule.cuh, ``implicit_*``). FULL masks list every block as FULL; CAUSAL masks list the
    blocks between a row's first windowed key and its last query, FULL where every key precedes every query,
    PARTIAL (token rule, one document of text) where the window cuts the block, else CAUSAL."""
    pos = _BlockPositions(mask.q_len, mask.kv_len, mask.block_q, mask.block_kv, torch.device("cpu"))
    if mask.kind == MaskKind.FULL:
        types = torch.full((pos.q_first.shape[0], pos.k_first.shape[1]), _FULL, dtype=torch.int8)
    else:
        listed, cut = pos.k_first <= pos.q_last, torch.zeros((), dtype=torch.bool)
        if mask.window is not None:
            listed = listed & (pos.k_last >= pos.q_first - mask.window + 1)
            cut = pos.q_last - pos.k_first >= mask.window
        types = torch.where(cut, _PARTIAL, torch.where(pos.k_last <= pos.q_first, _FULL, _CAUSAL))
        types = torch.where(listed, types, _MASKED).to(torch.int8)
    return types[None, None], torch.full(types.shape, -1, dtype=torch.int32)[None, None]


def _library_builds_token_masks(ids: torch.Tensor) -> bool:
    """Whether `from_token_ids` hands these ids to the CUDA library: on a GPU, not being traced by
    torch.compile (the PyTorch build traces into the graph as it is), not forced to PyTorch, and the library loads."""
    if not ids.is_cuda or torch.compiler.is_compiling() or os.environ.get("OMNI_HF_BACKEND") == "reference":
        return False
    from . import _cuda

    return _cuda.available()


def _block_type(masked: torch.Tensor, full: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """int8 types from bool claims, in priority MASKED > FULL > CAUSAL > PARTIAL, by uint8 arithmetic:
    ``(3 - 2 full - causal + causal full) * not masked`` (uint8 wraps in between, never at the end)."""
    f, c, m = (x.to(torch.uint8) for x in (full, causal, masked))  # a cast: Inductor cannot bitcast bool
    return ((3 - 2 * f - c + c * f) * (1 - m)).to(torch.int8)


def token_ids_from_spans(
    spans: Sequence[Sequence[tuple[int, int]]],
    seq_len: int,
    sample_lengths: Sequence[Sequence[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token ids of the token rule from per-row spans (see `OmniBlockMask.from_spans`).

    Returns:
        doc_ids, group_ids: int32 ``[len(spans), seq_len]``. ``doc`` numbers the packed samples of a
        row from 0 (-1 = padding); ``grp`` numbers the spans of a row from 0 (-1 = causal text).
    """
    rows = len(spans)
    if sample_lengths is None:
        sample_lengths = [[seq_len]] * rows
    if len(sample_lengths) != rows:
        raise ValueError(f"sample_lengths: expected one list per row ({rows}), got {len(sample_lengths)}")
    doc_ids = np.full((rows, seq_len), -1, dtype=np.int32)
    group_ids = np.full((rows, seq_len), -1, dtype=np.int32)
    for row, (row_spans, lengths) in enumerate(zip(spans, sample_lengths)):
        bounds = np.cumsum([0, *lengths])
        if min(lengths, default=1) < 1 or bounds[-1] > seq_len:
            raise ValueError(f"sample_lengths[{row}]: expected positive lengths summing to at most "
                             f"seq_len={seq_len}, got {list(lengths)}")
        doc_ids[row, :bounds[-1]] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        if len(row_spans) == 0:
            continue
        span_array = _check_spans(np.asarray(row_spans, dtype=np.int64).reshape(-1, 2), bounds, row)
        marks = np.zeros(seq_len + 1, dtype=np.int64)
        ids = np.arange(1, len(span_array) + 1)
        np.add.at(marks, span_array[:, 0], ids)
        np.add.at(marks, span_array[:, 1], -ids)
        group_ids[row] = np.cumsum(marks[:-1]) - 1
    return doc_ids, group_ids


def _check_spans(spans: np.ndarray, bounds: np.ndarray, row: int) -> np.ndarray:
    """Spans ``[n, 2]`` must be non-empty, sorted, disjoint and each inside one sample of ``bounds``."""
    start, end = spans[:, 0], spans[:, 1]
    if (start < 0).any() or (end > bounds[-1]).any() or (end <= start).any():
        raise ValueError(f"spans[{row}]: expected 0 <= start < end <= {bounds[-1]} (the row's tokens), "
                         f"got {spans.tolist()}")
    if (start[1:] < end[:-1]).any():
        raise ValueError(f"spans[{row}]: expected sorted, non-overlapping spans, got {spans.tolist()}")
    sample_of_start = np.searchsorted(bounds, start, side="right")
    sample_of_last = np.searchsorted(bounds, end - 1, side="right")
    if (sample_of_start != sample_of_last).any():
        raise ValueError(f"spans[{row}]: a span crosses a packed-sample boundary {bounds.tolist()}: {spans.tolist()}")
    return spans


# ---------------------------------------------------------------------- checks


def _check_sizes(q_len: int, kv_len: int, block_q: int, block_kv: int) -> None:
    for name, value in (("q_len", q_len), ("kv_len", kv_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    for name, value in (("block_q", block_q), ("block_kv", block_kv)):
        if value not in BLOCK_SIZES:
            raise ValueError(f"{name}: expected one of {BLOCK_SIZES}, got {value!r}")


def _check_window(window) -> None:
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window: expected a positive int or None, got {window!r}")


def _check_token_ids(doc_ids, group_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise to int32 ``[B, kv_len]`` tensors on one device; group_ids None -> all text."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dtype.is_floating_point or doc_ids.dtype == torch.bool:
        raise TypeError(f"doc_ids: expected an integer tensor, got {_describe_value(doc_ids)}")
    if doc_ids.dim() == 1:
        doc_ids = doc_ids[None]
    if doc_ids.dim() != 2 or doc_ids.shape[1] == 0:
        raise ValueError(f"doc_ids: expected shape [B, kv_len] or [kv_len], got {tuple(doc_ids.shape)}")
    if group_ids is None:
        group_ids = torch.full_like(doc_ids, -1)
    if not isinstance(group_ids, torch.Tensor) or group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids: expected an integer tensor or None, got {_describe_value(group_ids)}")
    if group_ids.dim() == 1:
        group_ids = group_ids[None]
    batches = doc_ids.shape[0], group_ids.shape[0]
    if group_ids.dim() != 2 or group_ids.shape[1] != doc_ids.shape[1] or (batches[0] != batches[1] and 1 not in batches):
        raise ValueError(f"group_ids: expected the shape of doc_ids {tuple(doc_ids.shape)} (a batch of 1 on either "
                         f"side broadcasts), got {tuple(group_ids.shape)}")
    if group_ids.device != doc_ids.device:
        raise ValueError(f"group_ids: expected device {doc_ids.device} (that of doc_ids), got {group_ids.device}")
    batch = max(doc_ids.shape[0], group_ids.shape[0])
    return tuple(ids.to(torch.int32).expand(batch, -1).contiguous() for ids in (doc_ids, group_ids))


def _describe_value(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    return type(value).__name__


def _validate(m: OmniBlockMask) -> None:
    """All structural checks of `OmniBlockMask.validate`."""
    _check_sizes(m.q_len, m.kv_len, m.block_q, m.block_kv)
    if m.implicit:
        _check_window(m.window)
        held = [name for name in (*_TENSOR_FIELDS, "doc_ids", "group_ids", "token_ranges")
                if getattr(m, name) is not None]
        if held:
            raise ValueError(f"{held[0]}: expected None for an implicit mask (kind {m.kind.name}), got a tensor")
        return
    nq, nk = -(-m.q_len // m.block_q), -(-m.kv_len // m.block_kv)
    pool_size = m.partial_pool.shape[0]
    expected_pool = (pool_size, m.block_q, m.block_kv // 32)
    if tuple(m.partial_pool.shape) != expected_pool or m.partial_pool.dtype != torch.int32:
        raise ValueError(f"partial_pool: expected int32 of shape {expected_pool}, got "
                         f"{_describe_value(m.partial_pool)}")
    for prefix, rows, cols in (("kv", nq, nk), ("q", nk, nq)):
        num, idx, types, partial = (getattr(m, f"{prefix}_{name}")
                                    for name in ("num_blocks", "indices", "types", "partial"))
        _validate_lists(prefix, num, idx, types, partial, m.batch, m.heads, rows, cols, pool_size)
    row_types, row_partial = m.block_table()
    col_types, col_partial = _table_from_lists(m.q_num_blocks, m.q_indices, m.q_types, m.q_partial, nq)
    if not (torch.equal(row_types, col_types.transpose(-1, -2))
            and torch.equal(row_partial, col_partial.transpose(-1, -2))):
        raise ValueError("q_indices / q_types / q_partial: the column view does not list the same blocks, types "
                         "and pool ids as the row view")
    token_partial = (row_types == _PARTIAL) & (row_partial < 0)
    if bool(token_partial.any()):
        if m.doc_ids is None or m.group_ids is None:
            raise ValueError("doc_ids / group_ids: PARTIAL blocks with pool id -1 use the token rule, which needs "
                             "both id tensors, got None")
        for name in ("doc_ids", "group_ids"):
            ids = getattr(m, name)
            if ids.dim() != 2 or ids.shape[1] != m.kv_len or ids.shape[0] not in (1, m.batch) or ids.dtype != torch.int32:
                raise ValueError(f"{name}: expected int32 [{m.batch} or 1, kv_len={m.kv_len}], got {_describe_value(ids)}")
        if m.q_len > m.kv_len:
            raise ValueError(f"q_len: the token rule needs q_len <= kv_len={m.kv_len}, got {m.q_len}")
    if m.token_ranges is not None:
        _validate_token_ranges(m)


def _validate_token_ranges(m: OmniBlockMask) -> None:
    """token_ranges must be what `token_ranges` derives from the mask's ids and window (the kernels trust it)."""
    if m.doc_ids is None or m.group_ids is None:
        raise ValueError("token_ranges: derived from doc_ids / group_ids, which are None; expected None")
    expected = (m.doc_ids.shape[0], m.kv_len, 4)
    if tuple(m.token_ranges.shape) != expected or m.token_ranges.dtype != torch.int32:
        raise ValueError(f"token_ranges: expected int32 of shape {expected}, got {_describe_value(m.token_ranges)}")
    if not torch.equal(m.token_ranges, token_ranges(m.doc_ids, m.group_ids, m.window)):
        raise ValueError("token_ranges: differs from token_ranges(doc_ids, group_ids, window); rebuild the mask with "
                         "from_token_ids after changing its ids or window")


def _validate_lists(prefix, num, idx, types, partial, batch, heads, rows, cols, pool_size) -> None:
    """Shapes, dtypes, ranges and ordering of one view's block lists."""
    if tuple(num.shape) != (batch, heads, rows) or num.dtype != torch.int32:
        raise ValueError(f"{prefix}_num_blocks: expected int32 of shape {(batch, heads, rows)}, got {_describe_value(num)}")
    max_blocks = idx.shape[-1] if idx.dim() == 4 else -1
    for name, tensor, dtype in (("indices", idx, torch.int32), ("types", types, torch.int8),
                                ("partial", partial, torch.int32)):
        if tuple(tensor.shape) != (batch, heads, rows, max_blocks) or tensor.dtype != dtype:
            raise ValueError(f"{prefix}_{name}: expected {dtype} of shape {(batch, heads, rows, 'maxBlocks')}, "
                             f"got {_describe_value(tensor)}")
    if bool(((num < 0) | (num > max_blocks)).any()):
        raise ValueError(f"{prefix}_num_blocks: expected counts in [0, {max_blocks}], got min {int(num.min())} "
                         f"max {int(num.max())}")
    active = torch.arange(max_blocks, device=num.device) < num[..., None]
    if bool((active & ((idx < 0) | (idx >= cols))).any()):
        raise ValueError(f"{prefix}_indices: expected active indices in [0, {cols})")
    if bool((active[..., 1:] & (idx[..., 1:] <= idx[..., :-1])).any()):
        raise ValueError(f"{prefix}_indices: expected strictly ascending active indices")
    valid_type = (types == _FULL) | (types == _CAUSAL) | (types == _PARTIAL)
    if bool((active & ~valid_type).any()):
        raise ValueError(f"{prefix}_types: expected FULL, CAUSAL or PARTIAL ({int(BlockType.FULL)}, "
                         f"{int(BlockType.CAUSAL)}, {int(BlockType.PARTIAL)}) for every active block")
    pooled = active & (types == _PARTIAL)
    if bool((pooled & ((partial < -1) | (partial >= pool_size))).any()):
        raise ValueError(f"{prefix}_partial: expected pool ids in [-1, {pool_size}) for PARTIAL blocks")
    if bool((active & (types != _PARTIAL) & (partial != -1)).any()):
        raise ValueError(f"{prefix}_partial: expected -1 for blocks that are not PARTIAL")
