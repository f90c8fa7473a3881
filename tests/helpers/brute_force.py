"""Independent dense definitions of the masks and of attention, readers of block lists written from docs/design.md (not
from the code under test), and the random inputs of the differential tests; for tests only (S x S is fine here)."""

from __future__ import annotations

import dataclasses
import itertools

import torch

from omni_hf import OmniBlockMask


def causal_dense(q_len: int, kv_len: int, window: int | None = None) -> torch.Tensor:
    """bool [q_len, kv_len]: query i (absolute position i + kv_len - q_len) sees keys at or before it, with
    ``window`` only those fewer than ``window`` positions back."""
    back = torch.arange(q_len)[:, None] + (kv_len - q_len) - torch.arange(kv_len)[None, :]
    return (back >= 0) if window is None else (back >= 0) & (back < window)


def token_rule_dense(doc: torch.Tensor, grp: torch.Tensor, q_len: int, window: int | None = None,
                     window_covers_groups: bool = False) -> torch.Tensor:
    """bool [B, 1, q_len, kv_len] of the token rule, written from its definition in docs/design.md (on doc's device):
    the window cuts the causal part, or with ``window_covers_groups`` every pair (group pairs too)."""
    kv_len = doc.shape[-1]
    doc, grp = doc.long(), grp.long()
    i = torch.arange(kv_len - q_len, kv_len, device=doc.device)[:, None]
    j = torch.arange(kv_len, device=doc.device)[None, :]
    q_doc, k_doc = doc[:, i], doc[:, j]
    q_grp, k_grp = grp[:, i], grp[:, j]
    in_window = torch.ones_like(j <= i) if window is None else i - j < window
    same_doc, same_group = (q_doc >= 0) & (q_doc == k_doc), (q_grp >= 0) & (q_grp == k_grp)
    if window_covers_groups:
        allowed = same_doc & in_window & ((j <= i) | same_group)
    else:
        allowed = same_doc & (((j <= i) & in_window) | same_group)
    return allowed[:, None]


def spans_dense(spans, seq_len: int, sample_lengths=None) -> torch.Tensor:
    """bool [B, 1, S, S] straight from spans: same sample and (causal or same span); padding sees nothing."""
    rows = []
    for r, row_spans in enumerate(spans):
        lengths = [seq_len] if sample_lengths is None else sample_lengths[r]
        allowed = torch.zeros(seq_len, seq_len, dtype=torch.bool)
        start = 0
        for length in lengths:
            allowed[start:start + length, start:start + length] = torch.ones(length, length).tril().bool()
            start += length
        for a, b in row_spans:
            allowed[a:b, a:b] = True
        rows.append(allowed)
    return torch.stack(rows)[:, None]


def naive_attention(q, k, v, allowed, scale, softcap=None):
    """float64 softmax attention with autograd; rows with no allowed key give 0 (and zero gradient).

    q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D] (K/V heads repeated here, on purpose unlike the reference),
    allowed bool broadcastable to [B, Hq, Sq, Skv]. Returns out [B, Hq, Sq, D] and lse [B, Hq, Sq].
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    allowed = allowed.expand_as(s)
    has_key = allowed.any(-1, keepdim=True)
    s = torch.where(allowed, s, float("-inf"))
    s = torch.where(has_key, s, 0.0)
    p = torch.softmax(s, dim=-1) * has_key
    lse = torch.where(has_key, torch.logsumexp(s, -1, keepdim=True), float("-inf")).squeeze(-1)
    return torch.einsum("bhqk,bhkd->bhqd", p, v.double()), lse


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def placed_samples_dense(rows, width: int) -> torch.Tensor:
    """bool [len(rows), 1, width, width] of samples laid out in rows: ``rows[r]`` lists ``(column, length, spans)``
    of each sample in row r (spans relative to the sample). A sample's token sees the sample's tokens at or
    before it and its whole span; padding neither sees nor is seen."""
    out = torch.zeros(len(rows), 1, width, width, dtype=torch.bool)
    for r, samples in enumerate(rows):
        for column, length, spans in samples:
            block = torch.ones(length, length, dtype=torch.bool).tril()
            for a, b in spans:
                block[a:b, a:b] = True
            out[r, 0, column:column + length, column:column + length] = block
    return out


# ---------------------------------------------------------------------- reading masks back from their lists

_MASKED, _FULL, _CAUSAL, _PARTIAL = 0, 1, 2, 3  # BlockType, as docs/design.md numbers it


def table_from_lists(num, indices, types, partial, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Types int8 and pool ids int64 ``[B, H, rows, columns]`` (0 and -1 where nothing is listed), read entry by
    entry from one view's lists; asserts the active indices are in range and strictly ascending."""
    batch, heads, rows, _ = indices.shape
    table = torch.zeros(batch, heads, rows, columns, dtype=torch.int8)
    pool_ids = torch.full((batch, heads, rows, columns), -1, dtype=torch.int64)
    num, indices, types, partial = (x.cpu() for x in (num, indices, types, partial))
    for (b, h, r), n in zip(itertools.product(range(batch), range(heads), range(rows)), num.flatten().tolist()):
        listed = indices[b, h, r, :n].long()
        assert 0 <= n <= indices.shape[-1] and ((listed >= 0) & (listed < columns)).all(), (b, h, r, listed)
        assert (listed[1:] > listed[:-1]).all(), f"indices of ({b}, {h}, {r}) not ascending: {listed.tolist()}"
        assert (types[b, h, r, :n] != _MASKED).all(), f"a listed block of ({b}, {h}, {r}) is MASKED"
        table[b, h, r, listed] = types[b, h, r, :n].to(torch.int8)
        pool_ids[b, h, r, listed] = partial[b, h, r, :n].long()
    return table, pool_ids


def dense_from_block_table(types, pool_ids, mask) -> torch.Tensor:
    """bool [B, H, q_len, kv_len]: every listed block of ``types`` [B, H, nQ, nK] filled tile by tile with the element
    rule of docs/design.md (FULL, CAUSAL at absolute positions, PARTIAL from the pool's bits or, with pool id -1, the
    token rule over the mask's ids, or one document of text for an implicit mask); rows and keys past the lengths
    dropped."""
    q_len, kv_len, bq, bk = mask.q_len, mask.kv_len, mask.block_q, mask.block_kv
    batch, heads, nq, nk = types.shape
    padded = torch.zeros(batch, heads, nq * bq, nk * bk, dtype=torch.bool)
    qpos = torch.arange(nq * bq)[:, None] + (kv_len - q_len)
    causal = qpos >= torch.arange(nk * bk)[None, :]
    pool = torch.zeros(0, bq, bk // 32) if mask.partial_pool is None else mask.partial_pool.cpu()
    bits = ((pool[..., None].long() >> torch.arange(32)) & 1).bool().reshape(-1, bq, bk)
    token = None
    if ((types == _PARTIAL) & (pool_ids < 0)).any():
        if mask.implicit:  # their PARTIAL blocks are the window's cut through one document of text
            doc, grp = torch.zeros(1, kv_len, dtype=torch.int32), torch.full((1, kv_len), -1, dtype=torch.int32)
        else:
            assert mask.token_rule is not None, "PARTIAL blocks with pool id -1 need the token rule's ids"
            doc, grp = mask.token_rule.doc_ids.cpu(), mask.token_rule.group_ids.cpu()
        token = torch.zeros(doc.shape[0], nq * bq, nk * bk, dtype=torch.bool)
        token[:, :q_len, :kv_len] = token_rule_dense(doc, grp, q_len, mask.window, mask.window_covers_groups)[:, 0]
    for b, h, r, c in torch.nonzero(types).tolist():
        rows, cols = slice(r * bq, (r + 1) * bq), slice(c * bk, (c + 1) * bk)
        kind, pool_id = int(types[b, h, r, c]), int(pool_ids[b, h, r, c])
        if kind == _FULL:
            padded[b, h, rows, cols] = True
        elif kind == _CAUSAL:
            padded[b, h, rows, cols] = causal[rows, cols]
        elif kind == _PARTIAL and pool_id >= 0:
            padded[b, h, rows, cols] = bits[pool_id]
        elif kind == _PARTIAL:
            padded[b, h, rows, cols] = token[b if token.shape[0] > 1 else 0, rows, cols]
        else:
            raise AssertionError(f"block ({b}, {h}, {r}, {c}) has type {kind}")
    return padded[:, :, :q_len, :kv_len]


def block_mask_dense(mask) -> torch.Tensor:
    """bool [B, H, q_len, kv_len] of an `OmniBlockMask`, read from its row-view lists (after checking that the column
    view lists the same blocks, types and pool ids); an implicit mask from the blocks the kernels derive."""
    if mask.implicit:
        return dense_from_block_table(*mask.block_table(), mask)
    nq, nk = -(-mask.q_len // mask.block_q), -(-mask.kv_len // mask.block_kv)
    rows = table_from_lists(mask.kv.num_blocks, mask.kv.indices, mask.kv.types, mask.kv.partial, nk)
    cols = table_from_lists(mask.q.num_blocks, mask.q.indices, mask.q.types, mask.q.partial, nq)
    assert torch.equal(rows[0], cols[0].transpose(-1, -2)), "the column view lists other blocks or types"
    assert torch.equal(rows[1], cols[1].transpose(-1, -2)), "the column view lists other pool ids"
    return dense_from_block_table(*rows, mask)


def tightest_block_types(dense: torch.Tensor, block_q: int, block_kv: int) -> torch.Tensor:
    """int8 [B, H, nQ, nK] of a dense [B, H, q_len, kv_len] mask: MASKED when no pair is allowed, FULL when every
    in-range pair is, CAUSAL when the block equals the bottom-right causal triangle, else PARTIAL."""
    q_len, kv_len = dense.shape[-2:]
    nq, nk = -(-q_len // block_q), -(-kv_len // block_kv)

    def tiles(x: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(*x.shape[:-2], nq * block_q, nk * block_kv, dtype=torch.bool, device=x.device)
        padded[..., :q_len, :kv_len] = x
        return padded.unflatten(-2, (nq, block_q)).unflatten(-1, (nk, block_kv)).transpose(-3, -2)

    allowed = tiles(dense)
    count = allowed.sum((-1, -2))
    in_range = tiles(torch.ones(q_len, kv_len, dtype=torch.bool, device=dense.device)).sum((-1, -2))
    causal = (allowed == tiles(causal_dense(q_len, kv_len).to(dense.device))).all(-1).all(-1)
    types = torch.full(count.shape, _PARTIAL, dtype=torch.int8, device=dense.device)
    types[causal] = _CAUSAL
    types[count == in_range] = _FULL
    types[count == 0] = _MASKED
    return types


def flex_dense(block_mask) -> torch.Tensor:
    """bool [B, H, q_len, kv_len] of a `torch.nn.attention.flex_attention.BlockMask` by Flex's semantics: blocks in
    the full lists are allowed, blocks in the partial lists where ``mask_mod`` allows, the rest masked."""
    q_len, kv_len = block_mask.seq_lengths
    bq, bk = block_mask.BLOCK_SIZE
    nk = -(-kv_len // bk)

    def listed(num, indices):
        table = torch.zeros(*indices.shape[:-1], nk, dtype=torch.bool)
        for (b, h, r), n in zip(itertools.product(*(range(x) for x in num.shape)), num.flatten().tolist()):
            table[b, h, r, indices[b, h, r, :n].long()] = True
        return table

    partial = listed(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = (listed(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
            if block_mask.full_kv_num_blocks is not None else torch.zeros_like(partial))
    batch, heads = partial.shape[:2]
    b, h = torch.arange(batch)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    q, kv = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
    qb, kb = q // bq, kv // bk
    allowed = block_mask.mask_mod(b, h, q, kv) & partial[b, h, qb, kb]
    return (allowed | full[b, h, qb, kb]).expand(batch, heads, q_len, kv_len)


# ---------------------------------------------------------------------- random inputs of the differential tests


def packed_vlm_ids(batch: int, length: int, seed: int, doc_range=(100, 700), text_range=(1, 100),
                   image_range=(30, 200), padded: bool = True, gaps: bool = False,
                   device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """doc / group ids int32 [batch, length] of packed interleaved samples, numbered along the row as the collator
    does: each document alternates text runs and images (one group id each); with `padded`, a random tail of each
    row is padding (doc -1); with `gaps`, also up to 2 padding tokens before each document."""
    g = torch.Generator().manual_seed(seed)

    def rand(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    doc = torch.full((batch, length), -1, dtype=torch.int32)
    grp = torch.full((batch, length), -1, dtype=torch.int32)
    for b in range(batch):
        end_of_row, pos, d, group = length - (rand(0, length // 8) if padded else 0), 0, 0, 0
        while pos < end_of_row:
            pos += rand(0, 2) if gaps else 0
            end = min(pos + rand(*doc_range), end_of_row)
            doc[b, pos:end] = d
            p = pos + rand(*text_range)
            while p < end:
                img = min(rand(*image_range), end - p)
                grp[b, p:p + img] = group
                group += 1
                p += img + rand(*text_range)
            pos, d = end, d + 1
    return doc.to(device), grp.to(device)


def random_token_ids(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [batch, length] doc and group ids: packed documents with padding (-1) on the left, on the right and
    between documents, and images (groups) of random sizes, some sharing an id or crossing a document boundary."""
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=gen))

    doc = torch.empty(batch, length, dtype=torch.int32)
    grp = torch.full((batch, length), -1, dtype=torch.int32)
    for b in range(batch):
        bounds = [0, *sorted(draw(0, length) for _ in range(draw(0, 5))), length]
        for d, (start, end) in enumerate(zip(bounds, bounds[1:])):
            doc[b, start:end] = d
        if draw(0, 1):
            doc[b, :draw(0, length // 4)] = -1
        doc[b, length - draw(0, length // 4):] = -1
        if draw(0, 1):
            start = draw(0, length - 1)
            doc[b, start:start + draw(1, 40)] = -1
        for _ in range(draw(0, 6)):
            start = draw(0, length - 1)
            grp[b, start:start + draw(1, 300)] = draw(0, 7)
    return doc, grp


def without_ranges(mask):
    """``mask`` with its token rule's ranges dropped, so the kernels compare ids instead of testing ranges."""
    return dataclasses.replace(mask, token_rule=dataclasses.replace(mask.token_rule, ranges=None))


def masks_of_every_kind(batch, heads_q, q_len, kv_len, device, gen) -> list[tuple[str, OmniBlockMask]]:
    """(name, mask) of every kind: causal, windowed, full, the token rule (with and without a window) over packed
    VLM ids whose padding rows see no key, and a random dense mask per head whose first rows see no key."""
    doc, grp = packed_vlm_ids(batch, kv_len, seed=int(torch.randint(0, 1 << 30, (), generator=gen)),
                              doc_range=(40, 300), image_range=(20, 90), device=device)
    doc[0, kv_len - q_len: kv_len - q_len + 5] = -1  # query rows of padding: no allowed key
    dense = torch.rand(batch, heads_q, q_len, kv_len, generator=gen).to(device) < 0.3
    dense[:, :, :3] = False
    return [
        ("causal", OmniBlockMask.causal(q_len, kv_len)),
        ("window", OmniBlockMask.causal(q_len, kv_len, window=70)),
        ("full", OmniBlockMask.full(q_len, kv_len)),
        ("token rule", OmniBlockMask.from_token_ids(doc, grp, q_len=q_len)),
        ("token rule, window", OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, window=100)),
        ("dense", OmniBlockMask.from_dense(dense)),
    ]
