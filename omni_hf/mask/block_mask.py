"""Typed block masks for omni attention: `BlockType`, `OmniBlockMask` and its builders.

A mask is stored per (Q block, KV block) pair as one of four types, so a kernel skips what is masked
and runs unmasked tiles with no mask code. The element rule every builder, the reference and every
kernel share (see `csrc/include/omni_attention.h`): for query row ``i`` (absolute position
``qpos = i + kv_len - q_len``) and key ``j``, with ``qb = i // block_q`` and ``kb = j // block_kv``:

- ``kb`` absent from the active blocks of row ``qb``: not allowed (MASKED);
- FULL: allowed;  CAUSAL: allowed iff ``qpos >= j``;
- PARTIAL with a pool index ``p >= 0``: bit ``j % block_kv`` of row ``i % block_q`` of pattern ``p``;
- PARTIAL with ``p == -1``: the token rule over per-token ``doc`` and ``grp`` ids,
  ``doc[qpos] >= 0 and doc[qpos] == doc[j] and ((j <= qpos and qpos - j < window)
  or (grp[qpos] >= 0 and grp[qpos] == grp[j]))``; with ``window_covers_groups`` the window cuts group pairs too,
  ``doc[qpos] >= 0 and doc[qpos] == doc[j] and qpos - j < window and (j <= qpos
  or (grp[qpos] >= 0 and grp[qpos] == grp[j]))`` (`omni_hf.mask.token_rule`).

Rows past ``q_len`` and keys past ``kv_len`` are never allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from ..kernels.token_mask import builds_token_masks, token_mask
from . import dense, flex
from .dense import classify_rows, empty_pool
from .key_padding import key_padding_table
from .lists import block_lists, table_from_lists
from .spans import token_ids_from_spans
from .token_blocks import (
    classify_token_blocks,
    classify_token_range_blocks,
    implicit_block_table,
    token_range_patterns,
)
from .token_ranges import token_ranges
from .token_rule import MaskMod, token_mask_mod
from .types import CAUSAL, FULL, PARTIAL, BlockType, MaskKind, block_size_pair
from .validation import check_flag, check_sizes, check_token_ids, check_window, describe_value, validate

__all__ = ["BlockLists", "OmniBlockMask", "TokenRule"]

_PATTERN_TILES = 256  # PARTIAL blocks whose patterns `from_token_id_ranges` evaluates at once
_PICTURE = {BlockType.MASKED: ".", BlockType.FULL: "F", BlockType.CAUSAL: "C", BlockType.PARTIAL: "P"}


@dataclasses.dataclass(frozen=True)
class BlockLists:
    """One view of the block lists, as the C ``OmniBlockList``: per row (a Q block in the row view, a KV block in
    the column view) its active blocks of the other side. Leading dims ``B`` and ``H`` may be 1 (broadcast).

    Attributes:
        num_blocks: int32 ``[B, H, rows]``, active blocks of each row.
        indices: int32 ``[B, H, rows, maxBlocks]``, their indices, ascending; entries past the count are ignored.
        types: int8 ``[B, H, rows, maxBlocks]``, the `BlockType` of each entry.
        partial: int32 ``[B, H, rows, maxBlocks]``, index into the pattern pool, -1 unless a pooled PARTIAL.
    """

    num_blocks: torch.Tensor
    indices: torch.Tensor
    types: torch.Tensor
    partial: torch.Tensor

    def as_tuple(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(num_blocks, indices, types, partial)``."""
        return self.num_blocks, self.indices, self.types, self.partial

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> BlockLists:
        return BlockLists(*(fn(t) for t in self.as_tuple()))


@dataclasses.dataclass(frozen=True)
class TokenRule:
    """The per-token ids of token-rule PARTIAL blocks (pool id -1), as the C ``OmniMask`` holds them.

    Attributes:
        doc_ids: int32 ``[B, kv_len]``, the packed sample of each token, -1 = padding.
        group_ids: int32 ``[B, kv_len]``, the bidirectional group of each token, -1 = causal text.
        ranges: int32 ``[B, kv_len, 4]``, the rule of each position as ranges (`omni_hf.mask.token_ranges` of the
            ids and the mask's window), which the CUDA kernels test instead of the ids where the ids allow it; set
            by `OmniBlockMask.from_token_ids`, else None (the kernels compare ids).
    """

    doc_ids: torch.Tensor
    group_ids: torch.Tensor
    ranges: torch.Tensor | None = None

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TokenRule:
        return TokenRule(fn(self.doc_ids), fn(self.group_ids), None if self.ranges is None else fn(self.ranges))


@dataclasses.dataclass(frozen=True)
class OmniBlockMask:
    """A block-sparse attention mask with typed blocks, mirroring the C ``OmniMask``.

    ``nQ = ceil(q_len / block_q)``, ``nK = ceil(kv_len / block_kv)``; builders list ``maxBlocks = nK`` per Q
    block and ``nQ`` per KV block, so that shapes never depend on the data. Implicit masks (``kind`` CAUSAL or
    FULL, from `causal` and `full`) hold no tensors: ``kv``, ``q``, ``partial_pool`` and ``token_rule`` are None.

    Attributes:
        q_len, kv_len: query and key lengths.
        block_q, block_kv: block sizes, 64 or 128 each.
        kind: `MaskKind`, BLOCKS unless the mask is implicit.
        kv: `BlockLists`, the row view: per Q block its active KV blocks (forward and dQ).
        q: `BlockLists`, the column view: per KV block its active Q blocks (dK, dV).
        partial_pool: int32 ``[P, block_q, block_kv // 32]``, deduplicated bit patterns of PARTIAL blocks;
            bit ``j`` of word ``w`` is key ``w * 32 + j`` of the block.
        token_rule: `TokenRule` (ids, and their ranges) for token-rule PARTIAL blocks, or None.
        window: sliding window of the causal part (token rule, or an implicit CAUSAL mask), or None.
        window_covers_groups: False: the token rule's window cuts its causal part only (a group is seen whole);
            True: it cuts group pairs too (Transformers' sliding layers of Gemma 3 and 4). Read only with a window.
    """

    q_len: int
    kv_len: int
    block_q: int = 128
    block_kv: int = 128
    kind: MaskKind = MaskKind.BLOCKS
    kv: BlockLists | None = None
    q: BlockLists | None = None
    partial_pool: torch.Tensor | None = None
    token_rule: TokenRule | None = None
    window: int | None = None
    window_covers_groups: bool = False

    # ------------------------------------------------------------------ sizes

    @property
    def implicit(self) -> bool:
        """True for masks that sizes describe (kind CAUSAL or FULL): no tensors, any device."""
        return self.kind != MaskKind.BLOCKS

    @property
    def batch(self) -> int:
        """Leading batch dim of the lists (1 when the mask broadcasts over the batch)."""
        return 1 if self.implicit else self.kv.num_blocks.shape[0]

    @property
    def heads(self) -> int:
        """Leading head dim of the lists (1 when the mask broadcasts over the query heads)."""
        return 1 if self.implicit else self.kv.num_blocks.shape[1]

    @property
    def num_q_blocks(self) -> int:
        return -(-self.q_len // self.block_q)

    @property
    def num_kv_blocks(self) -> int:
        return -(-self.kv_len // self.block_kv)

    @property
    def device(self) -> torch.device | None:
        """The device of the lists; None for an implicit mask, which serves every device."""
        return None if self.implicit else self.kv.num_blocks.device

    # ------------------------------------------------------------------ builders

    @classmethod
    def causal(
        cls,
        q_len: int,
        kv_len: int | None = None,
        *,
        block_size: int | tuple[int, int] = 128,
        window: int | None = None,
    ) -> OmniBlockMask:
        """Causal mask with bottom-right alignment (query ``i`` sees keys ``j <= i + kv_len - q_len``).

        With ``window``, keys must also satisfy ``qpos - j < window``. Implicit (`MaskKind.CAUSAL`): nothing is
        built, on any device; the kernels derive every block from its position. ``block_size`` as in every
        builder: 64 or 128 for both sides, or a ``(block_q, block_kv)`` pair of them (FlexAttention's ``BLOCK_SIZE``).
        """
        return cls._implicit(MaskKind.CAUSAL, q_len, kv_len, block_size, window)

    @classmethod
    def full(cls, q_len: int, kv_len: int | None = None, *, block_size: int | tuple[int, int] = 128) -> OmniBlockMask:
        """Every query sees every key (bidirectional attention, e.g. a vision tower). Implicit
        (`MaskKind.FULL`): nothing is built, on any device."""
        return cls._implicit(MaskKind.FULL, q_len, kv_len, block_size, None)

    @classmethod
    def _implicit(cls, kind: MaskKind, q_len: int, kv_len: int | None, block_size: int | tuple[int, int],
                  window: int | None) -> OmniBlockMask:
        block_q, block_kv = block_size_pair(block_size)
        kv_len = q_len if kv_len is None else kv_len
        check_sizes(q_len, kv_len, block_q, block_kv)
        check_window(window)
        return cls(q_len, kv_len, block_q, block_kv, kind=kind, window=window)

    @classmethod
    def from_token_ids(
        cls,
        doc_ids: torch.Tensor,
        group_ids: torch.Tensor | None = None,
        *,
        q_len: int | None = None,
        block_size: int | tuple[int, int] = 128,
        window: int | None = None,
        window_covers_groups: bool = False,
    ) -> OmniBlockMask:
        """Token-rule mask from per-token ids: the VLM fast path, O(S) metadata and no pool.

        Args:
            doc_ids: int ``[B, kv_len]`` (or ``[kv_len]``): the packed sample of each token, -1 = padding.
            group_ids: int, same shape: the bidirectional group (image) of each token, -1 = causal text.
                None means all text. A batch of 1 in either broadcasts over the other's batch.
            q_len: number of query rows, the last ``q_len`` positions (default ``kv_len``).
            block_size: 64 or 128, or a ``(block_q, block_kv)`` pair of them.
            window: optional sliding window for the causal part (``qpos - j < window``).
            window_covers_groups: False (default): the window cuts the causal part only, a group is seen whole;
                True: it cuts group pairs too, as Transformers' sliding layers of Gemma 3 and 4 (``and_masks(or_masks(
                causal, blockwise_overlay), sliding_window_overlay)``): keys further back than the window are never
                seen, a group's later keys always are (`omni_hf.mask.token_rule`).

        Ids below -1 raise a ValueError naming the argument, the value and where it is, when the ids are on the CPU;
        on an accelerator that check would cost a host sync, so such ids are not checked there.

        Block summaries (min / max of doc and group per block) classify each block pair; fixed output
        shapes and no host sync. The mask also carries `TokenRule.ranges`, each position's allowed keys as one range
        where the ids allow it (ids increasing along the row, one run each: as the collator numbers them), which
        the CUDA kernels test instead of comparing ids. On a GPU with the CUDA library loaded this is four kernel
        launches (``omni_build_token_mask``); elsewhere, under ``torch.compile`` tracing, or with
        ``OMNI_HF_BACKEND=reference``, vectorised PyTorch ops give the same tensors.
        """
        block_q, block_kv = block_size_pair(block_size)
        doc_ids, group_ids = check_token_ids(doc_ids, group_ids)
        kv_len = doc_ids.shape[1]
        q_len = kv_len if q_len is None else q_len
        check_sizes(q_len, kv_len, block_q, block_kv)
        if q_len > kv_len:
            raise ValueError(f"q_len: expected at most kv_len={kv_len} for a token-rule mask, got {q_len}")
        check_window(window)
        check_flag("window_covers_groups", window_covers_groups)
        pool = empty_pool(block_q, block_kv, doc_ids.device)
        if builds_token_masks(doc_ids):
            *lists, ranges = token_mask(doc_ids, group_ids, q_len, block_q, block_kv, window, window_covers_groups)
            return cls(q_len, kv_len, block_q, block_kv, kv=BlockLists(*lists[:4]), q=BlockLists(*lists[4:]),
                       partial_pool=pool, token_rule=TokenRule(doc_ids, group_ids, ranges), window=window,
                       window_covers_groups=window_covers_groups)
        types = classify_token_blocks(doc_ids, group_ids, q_len, block_q, block_kv, window, window_covers_groups)
        rule = TokenRule(doc_ids, group_ids, token_ranges(doc_ids, group_ids, window, window_covers_groups))
        return cls.from_block_table(types[:, None], None, pool, q_len=q_len, kv_len=kv_len,
                                    block_size=(block_q, block_kv), token_rule=rule, window=window,
                                    window_covers_groups=window_covers_groups)

    @classmethod
    def from_token_id_ranges(
        cls,
        doc_ids: torch.Tensor,
        group_ids: torch.Tensor | None,
        queries: tuple[int, int],
        keys: tuple[int, int],
        *,
        block_size: int | tuple[int, int] = 128,
        window: int | None = None,
    ) -> OmniBlockMask:
        """The token rule of the queries at positions ``queries[0]:queries[1]`` of rows ``[B, S]`` over the keys at
        ``keys[0]:keys[1]``, any two ranges of the row (a context-parallel rank's queries against another rank's
        keys): ``q_len`` and ``kv_len`` are the ranges' lengths, and row i / key j of the mask are positions
        ``queries[0] + i`` / ``keys[0] + j``.

        Where the keys end with the queries (``keys[1] == queries[1]``, ``keys[0] <= queries[0]``) this is
        `from_token_ids` of the keys' ids. Elsewhere bottom-right alignment does not hold, so the blocks are typed
        from block summaries (`classify_token_range_blocks`: FULL, masked, or PARTIAL, never CAUSAL) and each PARTIAL
        block's pattern is evaluated from the ids into the pool: O(partial blocks x block_q x block_kv), nothing of
        size S x S; one host sync (the number of PARTIAL blocks).
        """
        block_q, block_kv = block_size_pair(block_size)
        doc_ids, group_ids = check_token_ids(doc_ids, group_ids)
        check_window(window)
        length = doc_ids.shape[1]
        for name, span in (("queries", queries), ("keys", keys)):
            if (not isinstance(span, (tuple, list)) or len(span) != 2 or not all(isinstance(x, int) for x in span)
                    or not 0 <= span[0] < span[1] <= length):
                raise ValueError(f"{name}: expected positions (start, stop) with 0 <= start < stop <= {length} (the "
                                 f"rows' length), got {span!r}")
        (q_start, q_stop), (k_start, k_stop) = queries, keys
        if k_stop == q_stop and k_start <= q_start:
            return cls.from_token_ids(doc_ids[:, k_start:k_stop], group_ids[:, k_start:k_stop], q_len=q_stop - q_start,
                                      block_size=(block_q, block_kv), window=window)
        types = classify_token_range_blocks(doc_ids, group_ids, queries, keys, block_q, block_kv, window)
        tiles = (types == PARTIAL).nonzero()
        words = [dense.pack_patterns(token_range_patterns(doc_ids, group_ids, part, queries, keys, block_q, block_kv,
                                                          window), block_q, block_kv)
                 for part in tiles.split(_PATTERN_TILES)]
        pool, pool_ids = dense.dedupe_words(torch.cat(words), block_q, block_kv, doc_ids.device)
        partial = torch.full(types.shape, -1, dtype=torch.int32, device=doc_ids.device)
        partial[tiles[:, 0], tiles[:, 1], tiles[:, 2]] = pool_ids.to(torch.int32)
        return cls.from_block_table(types[:, None], partial[:, None], pool, q_len=q_stop - q_start,
                                    kv_len=k_stop - k_start, block_size=(block_q, block_kv), window=window)

    @classmethod
    def from_key_padding(
        cls,
        key_padding: torch.Tensor,
        q_len: int | None = None,
        *,
        block_size: int | tuple[int, int] = 128,
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
            raise TypeError(f"key_padding: expected a bool tensor, got {describe_value(key_padding)}")
        if key_padding.dim() == 1:
            key_padding = key_padding[None]
        if key_padding.dim() != 2 or key_padding.shape[1] == 0:
            raise ValueError(f"key_padding: expected shape [B, kv_len] or [kv_len], got {tuple(key_padding.shape)}")
        block_q, block_kv = block_size_pair(block_size)
        kv_len = key_padding.shape[1]
        q_len = kv_len if q_len is None else q_len
        check_sizes(q_len, kv_len, block_q, block_kv)
        types, pool_ids, pool = key_padding_table(key_padding, q_len, block_q, block_kv)
        return cls.from_block_table(types, pool_ids, pool, q_len=q_len, kv_len=kv_len, block_size=(block_q, block_kv))

    @classmethod
    def from_spans(
        cls,
        spans: Sequence[Sequence[tuple[int, int]]],
        seq_len: int,
        *,
        sample_lengths: Sequence[Sequence[int]] | None = None,
        block_size: int | tuple[int, int] = 128,
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
                                  block_size=block_size)

    @classmethod
    def from_dense(cls, dense: torch.Tensor, *, block_size: int | tuple[int, int] = 128) -> OmniBlockMask:
        """Classify a dense bool mask ``[q_len, kv_len]`` or ``[B|1, H|1, q_len, kv_len]`` (True = allowed).

        Blocks are classified tightest: all allowed -> FULL, exactly the causal triangle -> CAUSAL,
        none -> absent, anything else -> PARTIAL with its bit pattern in the pool.
        """
        if not isinstance(dense, torch.Tensor) or dense.dtype != torch.bool:
            raise TypeError(f"dense: expected a bool tensor, got {describe_value(dense)}")
        if dense.dim() == 2:
            dense = dense[None, None]
        if dense.dim() != 4:
            raise ValueError(f"dense: expected shape [q_len, kv_len] or [B, H, q_len, kv_len], "
                             f"got {tuple(dense.shape)}")
        batch, heads, q_len, kv_len = dense.shape
        return cls._from_rows(lambda start, stop: dense[:, :, start:stop], batch, heads, q_len, kv_len, block_size,
                              dense.device)

    @classmethod
    def from_mask_fn(
        cls,
        mask_mod: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        q_len: int,
        kv_len: int | None = None,
        *,
        batch: int = 1,
        heads: int = 1,
        block_size: int | tuple[int, int] = 128,
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

        return cls._from_rows(rows, batch, heads, q_len, kv_len, block_size, device)

    @classmethod
    def from_flex(cls, block_mask, *, block_size: int | tuple[int, int] = 128) -> OmniBlockMask:
        """Convert a `torch.nn.attention.flex_attention.BlockMask` (its exact element-wise semantics:
        Flex's full blocks allowed, its partial blocks where ``mask_mod`` allows, the rest masked)."""
        rows, batch, heads = flex.flex_rows(block_mask)
        q_len, kv_len = block_mask.seq_lengths
        return cls._from_rows(rows, batch, heads, q_len, kv_len, block_size, block_mask.kv_indices.device)

    @classmethod
    def from_block_table(cls, types: torch.Tensor, partial: torch.Tensor | None, partial_pool: torch.Tensor, *,
                         q_len: int, kv_len: int, block_size: int | tuple[int, int] = 128,
                         token_rule: TokenRule | None = None, window: int | None = None,
                         window_covers_groups: bool = False) -> OmniBlockMask:
        """The one constructor every builder of block lists goes through: both views from a dense block table.

        Args:
            types: int8 ``[B, H, nQ, nK]`` `BlockType` of every block pair.
            partial: int32 pool ids of the same shape (-1 where none), or None (no pooled blocks).
            partial_pool: int32 ``[P, block_q, block_kv // 32]``.
            block_size: 64 or 128, or a ``(block_q, block_kv)`` pair of them.
            token_rule, window, window_covers_groups: the token rule of PARTIAL blocks with pool id -1, as the
                mask's attributes.
        """
        block_q, block_kv = block_size_pair(block_size)
        row = block_lists(types, partial)
        col = block_lists(types.transpose(-1, -2).contiguous(),
                          None if partial is None else partial.transpose(-1, -2).contiguous())
        return cls(q_len, kv_len, block_q, block_kv, kv=BlockLists(*row), q=BlockLists(*col), partial_pool=partial_pool,
                   token_rule=token_rule, window=window, window_covers_groups=window_covers_groups)

    @classmethod
    def _from_rows(cls, rows: dense.RowFunction, batch, heads, q_len, kv_len, block_size, device) -> OmniBlockMask:
        """Classify a dense mask given as ``rows(start, stop) -> bool [B, H, stop - start, kv_len]``."""
        block_q, block_kv = block_size_pair(block_size)
        check_sizes(q_len, kv_len, block_q, block_kv)
        types, partial, pool = classify_rows(rows, batch, heads, q_len, kv_len, block_q, block_kv, device)
        return cls.from_block_table(types, partial, pool, q_len=q_len, kv_len=kv_len, block_size=block_size)

    # ------------------------------------------------------------------ the flat form the ops take

    def as_tuple(self) -> tuple[tuple[torch.Tensor | None, ...], tuple[int, ...]]:
        """The mask as the flat tensors and ints the ops take (inverse: `from_tuple`).

        Returns:
            tensors: 12 tensors, None where the mask has none: the row view ``kv.num_blocks, kv.indices,
                kv.types, kv.partial``, the column view ``q.num_blocks, q.indices, q.types, q.partial``, then
                ``partial_pool, doc_ids, group_ids, token_ranges`` (`omni_hf.ops.library` names the three parts).
            sizes: 7 ints ``q_len, kv_len, block_q, block_kv, window`` (0 for none) ``, window_covers_groups``
                (0 or 1) ``, kind``.
        """
        none4 = (None,) * 4
        rule = self.token_rule
        tensors = (*(self.kv.as_tuple() if self.kv is not None else none4),
                   *(self.q.as_tuple() if self.q is not None else none4), self.partial_pool,
                   *((rule.doc_ids, rule.group_ids, rule.ranges) if rule is not None else (None,) * 3))
        return tensors, (self.q_len, self.kv_len, self.block_q, self.block_kv, self.window or 0,
                         int(self.window_covers_groups), int(self.kind))

    @classmethod
    def from_tuple(cls, tensors: Sequence[torch.Tensor | None], sizes: Sequence[int]) -> OmniBlockMask:
        """The mask of `as_tuple`'s ``(tensors, sizes)``."""
        q_len, kv_len, block_q, block_kv, window, window_covers_groups, kind = sizes
        rows, cols, (pool, doc, grp, ranges) = tensors[:4], tensors[4:8], tensors[8:]
        return cls(q_len, kv_len, block_q, block_kv, kind=MaskKind(kind),
                   kv=None if rows[0] is None else BlockLists(*rows), q=None if cols[0] is None else BlockLists(*cols),
                   partial_pool=pool, token_rule=None if doc is None else TokenRule(doc, grp, ranges),
                   window=window or None, window_covers_groups=bool(window_covers_groups))

    # ------------------------------------------------------------------ views and conversions

    def mask_mod(self) -> MaskMod:
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
        result = (kind == FULL) | ((kind == CAUSAL) & (qpos >= kv_idx))
        is_partial = kind == PARTIAL
        if self.partial_pool.shape[0] > 0:
            jj = kv_idx % self.block_kv
            word = self.partial_pool[pool_id.clamp(min=0), q_idx % self.block_q, jj // 32]
            result = result | (is_partial & (pool_id >= 0) & ((word >> (jj % 32)) & 1).bool())
        if self.token_rule is not None:
            rule = token_mask_mod(self.token_rule.doc_ids, self.token_rule.group_ids, self.window,
                                  self.window_covers_groups)
            result = result | (is_partial & (pool_id < 0) & rule(b, None, qpos.clamp(min=0), kv_idx))
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
        for an implicit mask, whose blocks are those the kernels derive (`implicit_block_table`)."""
        if self.implicit:
            return implicit_block_table(self.kind, self.q_len, self.kv_len, self.block_q, self.block_kv, self.window)
        return table_from_lists(*self.kv.as_tuple(), self.num_kv_blocks)

    def to_flex(self):
        """Convert to a `torch.nn.attention.flex_attention.BlockMask` with the same element rule.

        FULL blocks become Flex's full blocks, CAUSAL and PARTIAL its partial blocks, whose
        ``mask_mod`` is `mask_mod`.
        """
        types, _ = self.block_table()
        return flex.to_flex(types, self.mask_mod(), self.q_len, self.kv_len, self.block_q, self.block_kv)

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
        validate(self)

    # ------------------------------------------------------------------ internals

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> OmniBlockMask:
        if self.implicit:
            return self
        return dataclasses.replace(self, kv=self.kv.map(fn), q=self.q.map(fn), partial_pool=fn(self.partial_pool),
                                   token_rule=None if self.token_rule is None else self.token_rule.map(fn))
