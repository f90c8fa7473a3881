"""Differential tests: every mask builder, the collator, the Transformers mask and the reference
attention against brute-force definitions, at batch > 1 and heads > 1, both block sizes (also unequal), lengths
off the block grid, padding, rows with no allowed key and windows. The internal row chunks of the builders and of
the reference are shrunk to a few block rows (or a few query rows), so that small cases cross them; the defaults
run too, and a few cases run at real size.

Masks are read back from their block lists by `brute_force.block_mask_dense` (written from docs/design.md, not from the
code under test) and also through `dense_rows` over uneven row ranges, the view the reference attends with.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import flex_attention as flex
from transformers import masking_utils as hf

import omni_hf.mask.dense as dense_module
from omni_hf import BlockType, OmniBlockMask, omni_attention
from omni_hf.data import OmniCollator
from omni_hf.integrations.transformers import omni_attention_forward, omni_mask
from omni_hf.integrations.transformers.layer_mask import layer_mask
from omni_hf.ops import reference
from tests.helpers.brute_force import (
    block_mask_dense,
    causal_dense,
    flex_dense,
    naive_attention,
    packed_vlm_ids,
    placed_samples_dense,
    random_token_ids,
    relative_error,
    spans_dense,
    table_from_lists,
    tightest_block_types,
    token_rule_dense,
)

BLOCKS = ((64, 64), (128, 128), (64, 128), (128, 64))
CHUNK_ROWS = (None, 1, 2, 3)  # block rows per builder chunk; None: the default
SETTINGS = settings(max_examples=60, deadline=None)


def rng(seed: int):
    """``draw(lo, hi)``: a seeded uniform int in [lo, hi], and the generator behind it."""
    gen = torch.Generator().manual_seed(seed)
    return (lambda lo, hi: int(torch.randint(lo, hi + 1, (), generator=gen))), gen


def shrink_builder_chunks(monkeypatch, block_rows, batch, heads, block_q, kv_len) -> None:
    """`_from_row_function` (from_dense, from_mask_fn, from_flex) classifies ``block_rows`` block rows per chunk."""
    if block_rows is not None:
        monkeypatch.setattr(dense_module, "DENSE_CHUNK_ELEMENTS", block_rows * batch * heads * block_q * kv_len)


def shrink_reference_chunks(monkeypatch, rows, batch, heads_q, kv_len) -> None:
    """The reference attends ``rows`` query rows per chunk."""
    if rows is not None:
        monkeypatch.setattr(reference, "_CHUNK_ELEMENTS", rows * batch * heads_q * kv_len)


def first_difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    got, expected = torch.broadcast_tensors(got, expected)
    wrong = torch.nonzero(got != expected)
    return f"{len(wrong)} wrong pairs, first (b, h, q, kv) = {wrong[0].tolist() if len(wrong) else None}"


def assert_mask_is(mask: OmniBlockMask, expected: torch.Tensor, seed: int = 0, row_ranges=None) -> None:
    """``mask`` validates, and its block lists (read back independently) and its `dense_rows` over ``row_ranges``
    (default: all rows, cut unevenly in up to four) equal ``expected`` bool [B|1, H|1, q_len, kv_len] (broadcast
    dims compared expanded)."""
    mask.validate()
    assert (mask.q_len, mask.kv_len) == tuple(expected.shape[-2:])
    read = block_mask_dense(mask)
    assert torch.equal(*torch.broadcast_tensors(read, expected)), "block lists: " + first_difference(read, expected)
    if row_ranges is None:
        draw, _ = rng(seed)
        bounds = sorted({0, mask.q_len, *(draw(1, mask.q_len) for _ in range(3))})
        row_ranges = list(zip(bounds, bounds[1:]))
    for start, stop in row_ranges:
        rows, want = mask.dense_rows(start, stop), expected[..., start:stop, :]
        assert torch.equal(*torch.broadcast_tensors(rows, want)), (
            f"dense_rows({start}, {stop}): " + first_difference(rows, want))


# ---------------------------------------------------------------------- causal


@st.composite
def lengths(draw, max_len=1200):
    """(q_len, kv_len) with q_len <= kv_len: prefill, decoding (1) and chunked prefill, mostly off the block grid."""
    kv_len = draw(st.integers(1, max_len))
    q_len = draw(st.one_of(st.just(kv_len), st.just(1), st.integers(1, kv_len)))
    return q_len, kv_len


@SETTINGS
@given(lengths(), st.sampled_from(BLOCKS), st.one_of(st.none(), st.integers(1, 1300)))
def test_causal_masks_equal_the_bottom_right_window_definition(sizes, blocks, window):
    """Implicit causal masks: the blocks the kernels derive (and dense_rows) give the bottom-right triangle, cut by
    the window where there is one."""
    q_len, kv_len = sizes
    mask = OmniBlockMask.causal(q_len, kv_len, block_size=(blocks[0], blocks[1]), window=window)
    qpos = torch.arange(q_len)[:, None] + kv_len - q_len
    j = torch.arange(kv_len)[None, :]
    expected = (j <= qpos) & (qpos - j < (window or kv_len + 1))
    assert_mask_is(mask, expected[None, None], seed=q_len + kv_len)


# ---------------------------------------------------------------------- token rule, spans


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.sampled_from(BLOCKS), st.sampled_from(["same", "doc 1", "group 1", "text"]),
       st.data())
def test_from_token_ids_equals_the_token_rule_with_batch_padding_images_and_windows(seed, blocks, ids_batch, data):
    """Batch 3 (or ids of batch 1 broadcast against the other's batch 3), q_len < kv_len and q_len = 1 (caches)."""
    kv_len = data.draw(st.integers(1, 900), "kv_len")
    q_len = data.draw(st.one_of(st.just(kv_len), st.just(1), st.integers(1, kv_len)), "q_len")
    window = data.draw(st.one_of(st.none(), st.integers(1, 400)), "window")
    doc, grp = random_token_ids(3, kv_len, seed)
    doc = doc[:1] if ids_batch == "doc 1" else doc
    grp = grp[:1] if ids_batch == "group 1" else None if ids_batch == "text" else grp
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, block_size=(blocks[0], blocks[1]), window=window)
    full_doc = doc.expand(3, -1)
    full_grp = torch.full_like(full_doc, -1) if grp is None else grp.expand(3, -1)
    assert mask.batch == 3
    assert_mask_is(mask, token_rule_dense(full_doc, full_grp, q_len, window), seed=seed)


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.sampled_from(BLOCKS), st.data())
def test_from_token_id_ranges_equals_the_token_rule_of_those_positions(seed, blocks, data):
    """Any query range over any key range of rows of batch 3 (before, after, overlapping, inside each other, and
    the keys ending with the queries, where it is `from_token_ids`), with windows: the token rule's rows and
    columns at those positions. Off the bottom-right alignment no block claims CAUSAL."""
    length = data.draw(st.integers(2, 700), "length")
    queries = tuple(sorted(data.draw(st.lists(st.integers(0, length), min_size=2, max_size=2, unique=True))))
    keys = tuple(sorted(data.draw(st.lists(st.integers(0, length), min_size=2, max_size=2, unique=True))))
    if data.draw(st.booleans(), "keys end with the queries"):
        keys = (min(keys[0], queries[0]), queries[1])
    window = data.draw(st.one_of(st.none(), st.integers(1, 300)), "window")
    doc, grp = random_token_ids(3, length, seed)
    mask = OmniBlockMask.from_token_id_ranges(doc, grp, queries, keys, block_size=blocks, window=window)
    rule = token_rule_dense(doc, grp, length, window)[..., queries[0]:queries[1], keys[0]:keys[1]]
    assert_mask_is(mask, rule, seed=seed)
    aligned = keys[1] == queries[1] and keys[0] <= queries[0]
    assert aligned == (mask.token_rule is not None)
    assert aligned or not (mask.block_table()[0] == BlockType.CAUSAL).any()


@pytest.mark.parametrize("queries, keys, message", [
    ((5, 5), (0, 4), r"queries: expected positions \(start, stop\) with 0 <= start < stop <= 40 .*got \(5, 5\)"),
    ((0, 8), (30, 41), r"keys: expected positions \(start, stop\) with 0 <= start < stop <= 40 .*got \(30, 41\)"),
    ((0, 8), [1.0, 3], r"keys: expected positions .*got \[1.0, 3\]"),
])
def test_from_token_id_ranges_refuses_ranges_outside_the_rows(queries, keys, message):
    doc = torch.zeros(2, 40, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        OmniBlockMask.from_token_id_ranges(doc, None, queries, keys)


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.sampled_from(BLOCKS), st.sampled_from(["same", "doc 1", "group 1"]), st.data())
def test_from_token_ids_with_the_window_over_groups_equals_its_definition_and_lists_no_block_past_the_window(
        seed, blocks, ids_batch, data):
    """``window_covers_groups``: batch 3 (ids of batch 1 broadcast now and then), groups of up to 300 keys against
    windows shorter and longer than them, q_len < kv_len and q_len = 1. Every pair is exact (so FULL, CAUSAL and
    MASKED claims hold), and no listed block lies wholly further back than the window: the window saves its blocks."""
    kv_len = data.draw(st.integers(1, 900), "kv_len")
    q_len = data.draw(st.one_of(st.just(kv_len), st.just(1), st.integers(1, kv_len)), "q_len")
    window = data.draw(st.integers(1, 400), "window")
    doc, grp = random_token_ids(3, kv_len, seed)
    doc, grp = (doc[:1] if ids_batch == "doc 1" else doc), (grp[:1] if ids_batch == "group 1" else grp)
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, block_size=blocks, window=window,
                                        window_covers_groups=True)
    assert mask.batch == 3 and mask.window_covers_groups
    assert_mask_is(mask, token_rule_dense(doc.expand(3, -1), grp.expand(3, -1), q_len, window, True), seed=seed)
    types, _ = mask.block_table()
    qb, kb = torch.nonzero(types.amax((0, 1)), as_tuple=True)  # blocks listed in any batch row
    nearest_gap = (qb * blocks[0] + kv_len - q_len) - torch.clamp((kb + 1) * blocks[1], max=kv_len) + 1
    assert bool((nearest_gap < window).all()), "a block wholly past the window is listed"


@st.composite
def packed_rows(draw, rows=3, max_len=700):
    """Rows of packed samples (some rows partly padding) with sorted image spans inside each sample."""
    seq_len = draw(st.integers(1, max_len))
    spans, samples = [], []
    for _ in range(rows):
        sample_lengths, row_spans, start = [], [], 0
        while start < seq_len and (not sample_lengths or draw(st.booleans())):
            length = draw(st.integers(1, seq_len - start))
            cursor = start
            while cursor < start + length and draw(st.integers(0, 2)):
                a = draw(st.integers(cursor, start + length - 1))
                b = draw(st.integers(a + 1, min(start + length, a + 300)))
                row_spans.append((a, b))
                cursor = b
            sample_lengths.append(length)
            start += length
        spans.append(row_spans)
        samples.append(sample_lengths)
    return spans, seq_len, samples


@SETTINGS
@given(packed_rows(), st.sampled_from(BLOCKS))
def test_from_spans_equals_the_spans_definition_for_packed_padded_rows(rows, blocks):
    spans, seq_len, samples = rows
    mask = OmniBlockMask.from_spans(spans, seq_len, sample_lengths=samples, block_size=(blocks[0], blocks[1]))
    assert_mask_is(mask, spans_dense(spans, seq_len, samples), seed=seq_len)


# ---------------------------------------------------------------------- dense, mask functions, Flex


def random_dense(batch, heads, q_len, kv_len, block_q, block_kv, seed) -> torch.Tensor:
    """bool [batch, heads, q_len, kv_len] drawn per block (independently per batch and head) as empty, full, the
    causal triangle, random bits of a random density, or one of three patterns shared across the whole mask (so
    equal patterns land in different row chunks); then some rows and columns emptied."""
    draw, gen = rng(seed)
    shared = torch.rand(3, block_q, block_kv, generator=gen) < 0.5
    causal = causal_dense(q_len, kv_len)
    dense = torch.zeros(batch, heads, q_len, kv_len, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads):
            for r in range(-(-q_len // block_q)):
                for c in range(-(-kv_len // block_kv)):
                    rows, cols = slice(r * block_q, (r + 1) * block_q), slice(c * block_kv, (c + 1) * block_kv)
                    tile = dense[b, h, rows, cols]
                    kind = draw(0, 5)
                    if kind == 1:
                        tile[:] = True
                    elif kind == 2:
                        tile[:] = causal[rows, cols]
                    elif kind == 3:
                        tile[:] = torch.rand(tile.shape, generator=gen) < draw(1, 9) / 10
                    elif kind >= 4:
                        tile[:] = shared[draw(0, 2), :tile.shape[0], :tile.shape[1]]
    for _ in range(draw(0, 3)):
        start = draw(0, q_len - 1)
        dense[draw(0, batch - 1), :, start:start + draw(1, 70)] = False
    for _ in range(draw(0, 2)):
        start = draw(0, kv_len - 1)
        dense[..., start:start + draw(1, 70)] = False
    return dense


def dense_cases(count: int, seed0: int):
    """Seeded (batch, heads, q_len, kv_len, blocks, chunk rows, seed): batch x heads > 1, several block rows."""
    cases = []
    for seed in range(seed0, seed0 + count):
        draw, _ = rng(seed)
        batch, heads = ((2, 3), (2, 1), (1, 3), (3, 2))[seed % 4]
        blocks = BLOCKS[draw(0, 3)]
        q_len = draw(3 * blocks[0] + 1, 700)
        kv_len = draw(1, 700)
        cases.append((batch, heads, q_len, kv_len, blocks, CHUNK_ROWS[(seed + seed // 4) % 4], seed))
    return cases


def case_id(case) -> str:
    batch, heads, q_len, kv_len, (block_q, block_kv), chunk_rows, seed = case
    return (f"B{batch}H{heads}-q{q_len}-kv{kv_len}-blocks{block_q}x{block_kv}-"
            f"chunk{'default' if chunk_rows is None else chunk_rows}-seed{seed}")


@pytest.mark.parametrize("case", dense_cases(16, 100), ids=case_id)
def test_from_dense_is_exact_and_tightest_across_row_chunks_with_batch_and_heads(case, monkeypatch):
    batch, heads, q_len, kv_len, (block_q, block_kv), chunk_rows, seed = case
    dense = random_dense(batch, heads, q_len, kv_len, block_q, block_kv, seed)
    shrink_builder_chunks(monkeypatch, chunk_rows, batch, heads, block_q, kv_len)
    mask = OmniBlockMask.from_dense(dense, block_size=(block_q, block_kv))
    assert_mask_is(mask, dense, seed=seed)
    nk = -(-kv_len // block_kv)
    types, pool_ids = table_from_lists(mask.kv.num_blocks, mask.kv.indices, mask.kv.types, mask.kv.partial, nk)
    assert torch.equal(types, tightest_block_types(dense, block_q, block_kv))
    pool = mask.partial_pool
    assert torch.unique(pool.flatten(1), dim=0).shape[0] == pool.shape[0], "the pool holds a pattern twice"
    assert torch.equal(torch.unique(pool_ids[pool_ids >= 0]), torch.arange(pool.shape[0])), "unused pool entries"


@pytest.mark.parametrize("case", dense_cases(12, 200), ids=case_id)
def test_from_mask_fn_is_exact_across_row_chunks_with_batch_and_heads(case, monkeypatch):
    """A mask_mod that depends on the batch and head index, with rows that allow no key."""
    batch, heads, q_len, kv_len, (block_q, block_kv), chunk_rows, seed = case
    period = seed % 37 + 5
    rows_seen = []

    def mask_mod(b, h, q_idx, kv_idx):
        rows_seen.append(q_idx.numel())
        same_period = (q_idx // period) == (kv_idx // period)
        return (same_period | (((kv_idx + h) % 5 == b) & (kv_idx <= q_idx + h * 50))) & (q_idx % 13 != b + h)

    shrink_builder_chunks(monkeypatch, chunk_rows, batch, heads, block_q, kv_len)
    mask = OmniBlockMask.from_mask_fn(mask_mod, q_len, kv_len, batch=batch, heads=heads, block_size=(block_q, block_kv))
    if chunk_rows is not None:
        assert max(rows_seen) <= chunk_rows * block_q and len(rows_seen) > 1
    b, h = torch.arange(batch)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    expected = mask_mod(b, h, torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :])
    assert_mask_is(mask, expected.expand(batch, heads, q_len, kv_len), seed=seed)


def flex_mask_mod(b, h, q_idx, kv_idx):
    return ((q_idx >= kv_idx) & ((q_idx - kv_idx + b) % (h + 3) != 1)) | ((kv_idx // 100) == (q_idx // 150) + b)


def random_flex_lists(batch, heads, q_len, kv_len, block, seed) -> flex.BlockMask:
    """A Flex BlockMask made from random partial / full block lists (full blocks where its mask_mod says False too:
    Flex's semantics, not the mask_mod, decide there)."""
    _, gen = rng(seed)
    nq, nk = -(-q_len // block[0]), -(-kv_len // block[1])
    kind = torch.randint(0, 3, (batch, heads, nq, nk), generator=gen)

    def lists(active):
        order = torch.argsort(active.int(), dim=-1, descending=True, stable=True).int()
        return active.sum(-1).int(), order

    return flex.BlockMask.from_kv_blocks(*lists(kind == 1), *lists(kind == 2), BLOCK_SIZE=block,
                                         mask_mod=flex_mask_mod, seq_lengths=(q_len, kv_len))


@pytest.mark.parametrize("source", ["create_block_mask", "random lists"])
@pytest.mark.parametrize("case", dense_cases(6, 300), ids=case_id)
def test_from_flex_keeps_flex_semantics_across_row_chunks_with_batch_and_heads(case, source, monkeypatch):
    batch, heads, q_len, kv_len, (block_q, block_kv), chunk_rows, seed = case
    flex_block = (128, 64) if seed % 2 else (64, 128)
    if source == "create_block_mask":
        block_mask = flex.create_block_mask(flex_mask_mod, batch, heads, q_len, kv_len, device="cpu",
                                            BLOCK_SIZE=flex_block)
    else:
        block_mask = random_flex_lists(batch, heads, q_len, kv_len, flex_block, seed)
    expected = flex_dense(block_mask)
    if source == "create_block_mask":  # Flex's own lists are exact: its dense mask is the mask_mod
        b, h = torch.arange(batch)[:, None, None, None], torch.arange(heads)[None, :, None, None]
        assert torch.equal(expected, flex_mask_mod(b, h, torch.arange(q_len)[:, None], torch.arange(kv_len)[None]))
    shrink_builder_chunks(monkeypatch, chunk_rows, batch, heads, block_q, kv_len)
    mask = OmniBlockMask.from_flex(block_mask, block_size=(block_q, block_kv))
    assert_mask_is(mask, expected, seed=seed)


@pytest.mark.parametrize("kind", ["token ids, window", "dense with heads", "causal, window"])
@pytest.mark.parametrize("blocks", [(64, 128), (128, 128)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_to_flex_block_mask_has_the_same_element_rule(kind, blocks):
    """Flex's reading of the converted lists (full blocks, partial blocks through its mask_mod) is the mask."""
    block_q, block_kv = blocks
    if kind == "token ids, window":
        doc, grp = random_token_ids(2, 500, seed=7)
        mask = OmniBlockMask.from_token_ids(doc, grp, q_len=430, block_size=(block_q, block_kv), window=90)
        expected = token_rule_dense(doc, grp, 430, 90)
    elif kind == "dense with heads":
        expected = random_dense(2, 3, 333, 420, block_q, block_kv, seed=8)
        mask = OmniBlockMask.from_dense(expected, block_size=(block_q, block_kv))
    else:
        mask = OmniBlockMask.causal(300, 700, block_size=(block_q, block_kv), window=150)
        qpos = torch.arange(300)[:, None] + 400
        expected = ((torch.arange(700) <= qpos) & (qpos - torch.arange(700) < 150))[None, None]
    got = flex_dense(mask.to_flex())
    assert torch.equal(*torch.broadcast_tensors(got, expected)), first_difference(got, expected)


# ---------------------------------------------------------------------- collator


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows of sample indices: longest first (ties in input order), each into the first row with room; rows in
    the order they were opened, samples of a row in input order."""
    rows, room = [], []
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        target = next((r for r, free in enumerate(room) if free >= lengths[index]), len(rows))
        if target == len(rows):
            rows.append([])
            room.append(capacity)
        rows[target].append(index)
        room[target] -= lengths[index]
    return [sorted(row) for row in rows]


def collator_cases():
    cases = []
    for seed in range(16):
        mode, side = ("pad", "pack")[seed % 2], ("right", "left")[seed // 2 % 2]
        cases.append((mode, side, (64, 128)[seed // 4 % 2], (None, 64, 100)[seed % 3], seed))
    return cases


@pytest.mark.parametrize("case", collator_cases(), ids=lambda c: f"{c[0]}-{c[1]}-block{c[2]}-multiple{c[3]}-seed{c[4]}")
def test_collator_mask_and_ids_equal_the_layout_definition(case):
    """Token ids, omni_doc_ids, omni_group_ids and the block mask against a layout written from the documentation
    (pad: one sample per row; pack: first-fit decreasing) and a mask written from the samples' spans."""
    mode, side, block, multiple, seed = case
    draw, gen = rng(seed)
    samples = []
    for _ in range(draw(3, 7)):
        length, spans, cursor = draw(1, 500), [], 0
        while draw(0, 2) and cursor < length:
            a = draw(cursor, length - 1)
            spans.append((a, draw(a + 1, min(length, a + 200))))
            cursor = spans[-1][1]
        samples.append({"input_ids": torch.randint(1, 30000, (length,), generator=gen).tolist(),
                        "modality_spans": spans})
    lengths = [len(s["input_ids"]) for s in samples]
    max_length = max(lengths) + draw(0, 400)
    options = dict(mode=mode, padding_side=side, pad_to_multiple_of=multiple, return_block_mask=True,
                   block_size=block)
    batch = OmniCollator(0, max_length=max_length, **options)(samples)

    rows = first_fit_decreasing(lengths, max_length) if mode == "pack" else [[i] for i in range(len(samples))]
    used = [sum(lengths[i] for i in row) for row in rows]
    width = -(-max(used) // (multiple or 1)) * (multiple or 1)
    input_ids = torch.zeros(len(rows), width, dtype=torch.int64)
    doc, grp = (torch.full((len(rows), width), -1, dtype=torch.int32) for _ in range(2))
    placed = []
    for r, row in enumerate(rows):
        column, group, placed_row = width - used[r] if side == "left" else 0, 0, []
        for d, index in enumerate(row):
            n, spans = lengths[index], samples[index]["modality_spans"]
            input_ids[r, column:column + n] = torch.tensor(samples[index]["input_ids"])
            doc[r, column:column + n] = d
            for a, b in spans:
                grp[r, column + a:column + b] = group
                group += 1
            placed_row.append((column, n, spans))
            column += n
        placed.append(placed_row)
    assert torch.equal(batch["input_ids"], input_ids)
    assert torch.equal(batch["omni_doc_ids"], doc) and torch.equal(batch["omni_group_ids"], grp)
    mask = batch["omni_block_mask"]
    assert (mask.block_q, mask.block_kv) == (block, block)
    assert_mask_is(mask, placed_samples_dense(placed, width), seed=seed)


# ---------------------------------------------------------------------- the Transformers integration

HF_BATCH = 3


def padding_2d(real: list[int], width: int, left: bool) -> torch.Tensor:
    """bool [B, width] attention mask (as the mask creators hand it on) with ``real[b]`` real tokens, padded on
    the left or the right."""
    mask = torch.arange(width)[None] < torch.tensor(real)[:, None]
    return mask.flip(-1) if left else mask


def restarting_positions(length: int, seed: int) -> torch.Tensor:
    """int64 [B, length] position_ids of packed samples (different cuts in each row)."""
    draw, _ = rng(seed)
    rows = []
    for _ in range(HF_BATCH):
        cuts = sorted({0, *(draw(1, length - 1) for _ in range(draw(1, 4)))})
        starts = torch.zeros(length, dtype=torch.int64)
        starts[cuts] = 1
        sample = starts.cumsum(0) - 1
        first = torch.tensor(cuts)[sample]
        rows.append(torch.arange(length) - first)
    return torch.stack(rows)


def block_sequence_ids(length: int, seed: int) -> torch.Tensor:
    """int64 [B, length] image block ids (-1 text) as Gemma3 / PaliGemma hand them over."""
    draw, _ = rng(seed)
    ids = torch.full((HF_BATCH, length), -1, dtype=torch.int64)
    for b in range(HF_BATCH):
        for image in range(draw(0, 4)):
            start = draw(0, length - 1)
            ids[b, start:start + draw(1, 200)] = image
    return ids


HF_SOURCES = ("causal", "bidirectional", "sliding window", "chunked", "packed by position_ids",
              "packed by position_ids, sliding window", "image blocks", "image blocks, sliding window",
              "image blocks under a sliding window", "packed by position_ids, image blocks under a sliding window",
              "packed by position_ids, image blocks",
              "a model's or-function (tile by tile)", "decode, dynamic cache", "chunked prefill, dynamic cache",
              "prefill, empty static cache", "chunked prefill, static cache", "decode, static cache",
              "sliding window cache",
              "a model's or-function, chunked prefill, static cache (tile by tile)")


def hf_mask_arguments(source: str, padding: str, seed: int) -> tuple[dict, torch.Tensor]:
    """`omni_mask` / `sdpa_mask` arguments as Transformers' mask creators build them for ``source``, and the
    bool [B, q_len] query rows of real tokens (Transformers leaves rows of padding tokens arbitrary)."""
    draw, _ = rng(seed)
    window = draw(20, 300)
    q_len = draw(300, 700)
    past, q_offset, kv_offset, kv_len, width = 0, 0, 0, q_len, q_len
    if "cache" in source:
        past = 0 if "empty" in source else draw(250, 600)
        q_len = 1 if "decode" in source else draw(2, 300)
        q_offset, width = past, past + q_len
        kv_len = past + q_len
        if "static" in source:
            kv_len, q_offset = width + draw(1, 200), torch.tensor(past)
        if source == "sliding window cache":
            kv_offset, kv_len = past - window + 1, window - 1 + q_len
    real = [width, *(draw(1, width) for _ in range(HF_BATCH - 1))]
    attention_mask = None if padding == "none" else padding_2d(real, width, padding == "left")
    args = dict(batch_size=HF_BATCH, q_length=q_len, kv_length=kv_len, q_offset=q_offset, kv_offset=kv_offset,
                mask_function=hf.causal_mask_function, attention_mask=attention_mask)
    sliding = hf.sliding_window_causal_mask_function(window)
    if source == "bidirectional":
        args |= dict(mask_function=hf.bidirectional_mask_function, allow_is_bidirectional_skip=True)
    elif "sliding window" in source and "packed" not in source and "image" not in source:
        args |= dict(mask_function=sliding, local_size=window)
    elif "image blocks under a sliding window" in source:  # Gemma 3 / 4's sliding layers: images cut by the window
        blocks = hf.or_masks(hf.causal_mask_function, hf.blockwise_overlay(block_sequence_ids(q_len, seed)))
        inner = hf.and_masks(blocks, hf.sliding_window_overlay(window))
        if source.startswith("packed"):
            inner = packed_mask_function(inner, restarting_positions(q_len, seed))
        args |= dict(mask_function=inner, local_size=window, use_vmap=True)
    elif source == "packed by position_ids, image blocks":  # Gemma 3's full layers on packed rows
        blocks = hf.blockwise_overlay(block_sequence_ids(q_len, seed))
        args |= dict(mask_function=packed_image_blocks(blocks, restarting_positions(q_len, seed)), use_vmap=True)
    elif source == "chunked":
        leading_padding = torch.zeros(HF_BATCH, dtype=torch.int64)
        if attention_mask is not None:
            leading_padding = (attention_mask.cumsum(-1) == 0).sum(-1)
        args |= dict(mask_function=hf.chunked_causal_mask_function(window, leading_padding), local_size=window)
    elif source.startswith("packed"):
        positions = restarting_positions(q_len, seed)
        inner, local = (sliding, window) if "sliding" in source else (hf.causal_mask_function, None)
        args |= dict(mask_function=packed_mask_function(inner, positions), local_size=local)
    elif source.startswith("image blocks"):
        inner, local = (sliding, window) if "sliding" in source else (hf.causal_mask_function, None)
        args |= dict(mask_function=hf.or_masks(inner, hf.blockwise_overlay(block_sequence_ids(q_len, seed))),
                     local_size=local)
    elif source.startswith("a model's"):
        prefix = torch.tensor([draw(0, q_len) for _ in range(HF_BATCH)])
        args |= dict(mask_function=hf.or_masks(hf.causal_mask_function, lambda b, h, q, kv: kv < prefix[b]),
                     use_vmap=True)
    rows = torch.ones(HF_BATCH, q_len, dtype=torch.bool)
    if attention_mask is not None:
        rows = attention_mask[:, past:past + q_len]
    return args, rows


def packed_mask_function(inner, positions: torch.Tensor):
    """``inner`` composed with packing by ``positions`` as the installed Transformers' `create_causal_mask` does it:
    5.24 remaps the positions and ands the packed sequences' ids, some releases before it had one compatibility
    function, and older ones (5.17 among them) and the packed sequences' ids alone."""
    packed = hf.find_packed_sequence_indices(positions)
    if hasattr(hf, "packed_sequence_compatibility_function"):
        return hf.packed_sequence_compatibility_function(inner, positions, packed)
    if hasattr(hf, "remap_positions_for_packed_sequence"):
        inner = hf.remap_positions_for_packed_sequence(inner, positions)
    return hf.and_masks(inner, hf.packed_sequence_mask_function(packed))


def packed_image_blocks(blocks, positions: torch.Tensor):
    """Causal with image ``blocks`` on rows packed by ``positions``, as the installed Transformers'
    `create_causal_mask` composes them: 5.24 ors the blocks onto causal remapped to positions within each sequence and
    ands the sequences outside; releases without the remap or the blocks onto causal and pack that."""
    if not hasattr(hf, "remap_positions_for_packed_sequence"):
        return packed_mask_function(hf.or_masks(hf.causal_mask_function, blocks), positions)
    causal = hf.remap_positions_for_packed_sequence(hf.causal_mask_function, positions)
    return hf.and_masks(hf.or_masks(causal, blocks), hf.packed_sequence_mask_function(
        hf.find_packed_sequence_indices(positions)))


def hf_paddings(source: str) -> tuple[str, ...]:
    if source.startswith("packed"):
        return ("none",)  # Transformers looks for packing only without an attention mask
    if "cache" in source:
        return ("left", "none")  # a cache's queries end the row: generation pads on the left
    return ("left", "right", "none")


HF_CASES = [(source, padding) for source in HF_SOURCES for padding in hf_paddings(source)]


@pytest.mark.parametrize("source, padding", HF_CASES)
def test_transformers_spec_mask_and_attention_equal_sdpa_mask_on_real_rows(source, padding, monkeypatch):
    """The block mask a layer builds from the "omni" spec, and the layer's attention, against Transformers' sdpa
    mask made with the same arguments: batch 3, several blocks, padding or none (per-row image ids beside ids of
    one row), caches (q_len < kv_len; static caches with their key rotation), with the builders' and the
    reference's row chunks shrunk for half the cases. Only the sources marked so are evaluated tile by tile."""
    seed = HF_CASES.index((source, padding))
    tile_by_tile, build = [], OmniBlockMask.from_mask_fn
    monkeypatch.setattr(OmniBlockMask, "from_mask_fn", lambda *a, **k: tile_by_tile.append(1) or build(*a, **k))
    args, rows = hf_mask_arguments(source, padding, seed)
    q_len, kv_len = args["q_length"], args["kv_length"]
    truth = hf.sdpa_mask(**{**args, "allow_is_bidirectional_skip": False}, allow_is_causal_skip=False)
    if seed % 2:
        shrink_builder_chunks(monkeypatch, 1, HF_BATCH, 1, 128, kv_len)
        shrink_reference_chunks(monkeypatch, 7, HF_BATCH, 4, kv_len)
    _, gen = rng(seed)
    q = torch.randn(HF_BATCH, 4, q_len, 16, generator=gen)
    k, v = (torch.randn(HF_BATCH, 2, kv_len, 16, generator=gen) for _ in range(2))
    spec = omni_mask(**args)
    block_mask, key_order = layer_mask(torch.nn.Module(), q, k, spec, None, None, {})
    slots = torch.arange(kv_len) if key_order is None else key_order
    read = block_mask_dense(block_mask).expand(HF_BATCH, -1, -1, -1)[:, 0]
    expected = truth[:, 0][..., slots]
    assert torch.equal(read[rows], expected[rows]), first_difference(read[rows], expected[rows])
    assert bool(tile_by_tile) == ("tile by tile" in source)

    out, _ = omni_attention_forward(torch.nn.Module(), q, k, v, spec, scaling=0.25)
    gold, _ = naive_attention(q.double(), k.double(), v.double(), truth, 0.25)
    live = rows[:, :, None].expand(-1, -1, 4)
    assert relative_error(out[live], gold.transpose(1, 2)[live]) < 1e-6


def assert_layer_mask_and_attention(spec, kwargs, expected, seed, sliding_window=None) -> None:
    """The layer's block mask (read back from its lists) equals ``expected`` bool [B|1, 1, q_len, kv_len], and its
    attention the float64 softmax under ``expected`` (GQA 4:2, the reference's chunks crossed)."""
    batch, q_len, kv_len = spec.batch_size, *expected.shape[-2:]
    _, gen = rng(seed)
    q = torch.randn(batch, 4, q_len, 16, generator=gen)
    k, v = (torch.randn(batch, 2, kv_len, 16, generator=gen) for _ in range(2))
    block_mask, key_order = layer_mask(torch.nn.Module(), q, k, spec, sliding_window, None, kwargs)
    assert key_order is None
    read = block_mask_dense(block_mask)
    assert torch.equal(*torch.broadcast_tensors(read, expected)), first_difference(read, expected)
    with pytest.MonkeyPatch.context() as mp:
        shrink_reference_chunks(mp, 11, batch, 4, kv_len)
        out, _ = omni_attention_forward(torch.nn.Module(), q, k, v, spec, scaling=0.25, sliding_window=sliding_window,
                                        **kwargs)
    gold, _ = naive_attention(q.double(), k.double(), v.double(), expected, 0.25)
    assert relative_error(out, gold.transpose(1, 2)) < 1e-6


@pytest.mark.parametrize("window", [None, 50])
@pytest.mark.parametrize("ids", ["doc and group ids", "doc ids of one row", "group ids only"])
def test_transformers_layer_mask_from_collator_ids_is_the_token_rule(ids, window):
    """``omni_doc_ids`` / ``omni_group_ids`` kwargs with the layer's sliding window, during chunked prefill
    (q_len < kv_len) of a batch of 3."""
    seed = 2 * ["doc and group ids", "doc ids of one row", "group ids only"].index(ids) + (window is None)
    doc, grp = random_token_ids(HF_BATCH, 600, seed)
    doc = doc[:1] if ids == "doc ids of one row" else torch.zeros_like(doc) if ids == "group ids only" else doc
    kwargs = {"omni_group_ids": grp} if ids == "group ids only" else {"omni_doc_ids": doc, "omni_group_ids": grp}
    spec = omni_mask(HF_BATCH, 450, 600, q_offset=150)
    expected = token_rule_dense(doc.expand(HF_BATCH, -1), grp, 450, window)
    assert_layer_mask_and_attention(spec, kwargs, expected, seed, sliding_window=window)


@pytest.mark.parametrize("source", ["causal", "sliding window"])
def test_transformers_layer_mask_from_cu_seq_lens_keeps_packed_sequences_apart(source):
    """``cu_seq_lens_k`` (DataCollatorWithFlattening): one flattened row of several sequences, tokens past the last
    sequence unused."""
    draw, _ = rng(len(source))
    lengths = [draw(1, 200) for _ in range(draw(2, 6))]
    seq_len = sum(lengths) + draw(0, 40)
    cu_seq_lens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    function, window = ((hf.causal_mask_function, None) if source == "causal"
                        else (hf.sliding_window_causal_mask_function(60), 60))
    spec = omni_mask(1, seq_len, seq_len, mask_function=function, local_size=window,
                     attention_mask=torch.ones(1, seq_len, dtype=torch.bool))
    segment = torch.full((seq_len,), -1)
    segment[:sum(lengths)] = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    i, j = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    same = (segment[:, None] == segment[None, :]) & (segment[:, None] >= 0)
    expected = same & (j <= i) & (i - j < (window or seq_len))
    assert_layer_mask_and_attention(spec, {"cu_seq_lens_k": cu_seq_lens}, expected[None, None], len(source))


@pytest.mark.parametrize("q_len", [1, 77, 300, 701])
@pytest.mark.parametrize("blocks", [(64, 64), (128, 128), (64, 128), (128, 64)])
def test_from_key_padding_is_every_real_key_for_every_query_row(q_len, blocks):
    """Bidirectional attention over padded keys (encoders, cross-attention): batch 3 with left, right, inner and
    no padding; query rows are never masked, whatever their count."""
    gen = torch.Generator().manual_seed(q_len)
    kv_len = 333
    keys = torch.rand(3, kv_len, generator=gen) < 0.7
    keys[0], keys[1, :50], keys[2, 250:] = True, False, False
    mask = OmniBlockMask.from_key_padding(keys, q_len, block_size=(blocks[0], blocks[1]))
    mask.validate()
    expected = keys[:, None, None, :].expand(3, 1, q_len, kv_len)
    assert torch.equal(block_mask_dense(mask), expected)
    assert torch.equal(mask.to_dense(), expected)


@pytest.mark.parametrize("source, padding", [
    pytest.param(source, padding) for source, padding in HF_CASES
    if padding != "none" and "cache" not in source and "tile by tile" not in source and source != "bidirectional"])
def test_transformers_layer_outputs_zero_on_rows_of_padding_tokens(source, padding):
    """The integration's promise (its module docstring): under the token rule rows of padding tokens output zeros
    (bidirectional masks never mask a query row, and tile-by-tile masks give what the mask function gives)."""
    seed = HF_CASES.index((source, padding))
    args, rows = hf_mask_arguments(source, padding, seed)
    assert (~rows).any(), "the case should hold padding query rows"
    _, gen = rng(seed)
    q = torch.randn(HF_BATCH, 4, args["q_length"], 16, generator=gen)
    k, v = (torch.randn(HF_BATCH, 2, args["kv_length"], 16, generator=gen) for _ in range(2))
    out, _ = omni_attention_forward(torch.nn.Module(), q, k, v, omni_mask(**args), scaling=0.25)
    assert (out[~rows] == 0).all(), f"{int((out[~rows] != 0).any(-1).any(-1).sum())} padding rows are not zero"


# ---------------------------------------------------------------------- attention through the reference


def attention_cases():
    """Seeded (mask kind, Hq, Hkv, q_len, kv_len, blocks, reference chunk rows, seed), batch 2."""
    cases = []
    kinds = ("token rule with padding", "dense per head", "causal window")
    for seed in range(18):
        draw, _ = rng(1000 + seed)
        heads_kv = 1 + seed % 2
        heads_q = heads_kv * (1, 2, 4)[seed // 2 % 3]
        kv_len = draw(130, 400)
        q_len = (kv_len, 1, draw(1, kv_len))[(seed + seed // 3) % 3]
        chunk_rows = (None, 5, 13, 50)[(seed + seed // 4) % 4]
        cases.append((kinds[seed % 3], heads_q, heads_kv, q_len, kv_len, BLOCKS[seed % 4], chunk_rows, 1000 + seed))
    return cases


def attention_mask_of(kind, batch, heads_q, q_len, kv_len, blocks, seed) -> tuple[OmniBlockMask, torch.Tensor]:
    """A block mask of ``kind`` and its brute-force dense mask [B|1, Hq|1, q_len, kv_len], with rows that allow
    no key (padding, emptied rows) and keys nobody sees."""
    block_q, block_kv = blocks
    if kind == "token rule with padding":
        doc, grp = random_token_ids(batch, kv_len, seed)
        doc[:, kv_len - q_len:kv_len - q_len + 1] = -1  # the first query row is padding
        mask = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, block_size=(block_q, block_kv), window=60)
        return mask, token_rule_dense(doc, grp, q_len, 60)
    if kind == "dense per head":
        dense = random_dense(batch, heads_q, q_len, kv_len, block_q, block_kv, seed)
        dense[:, :, 1::5] = False
        return OmniBlockMask.from_dense(dense, block_size=(block_q, block_kv)), dense
    mask = OmniBlockMask.causal(q_len, kv_len, block_size=(block_q, block_kv), window=40)
    qpos = torch.arange(q_len)[:, None] + kv_len - q_len
    return mask, ((torch.arange(kv_len) <= qpos) & (qpos - torch.arange(kv_len) < 40))[None, None]


def random_inputs(batch, heads_q, heads_kv, q_len, kv_len, dim, seed, dtype=torch.float64):
    """Fresh random q [B, Hq, Sq, D], k, v [B, Hkv, Skv, D] and dout (never zeros)."""
    _, gen = rng(seed)
    shapes = ((heads_q, q_len), (heads_kv, kv_len), (heads_kv, kv_len), (heads_q, q_len))
    return [torch.randn(batch, h, n, dim, generator=gen, dtype=dtype) for h, n in shapes]


def attention_case_id(case) -> str:
    kind, heads_q, heads_kv, q_len, kv_len, (block_q, block_kv), rows, seed = case
    return (f"{kind.replace(' ', '_')}-Hq{heads_q}-Hkv{heads_kv}-q{q_len}-kv{kv_len}-blocks{block_q}x{block_kv}-"
            f"chunk{'default' if rows is None else rows}-seed{seed}")


def assert_structural_zeros(out, lse, grads, allowed, heads_kv) -> None:
    """Rows with no allowed key: output exactly 0, LSE -inf, dq exactly 0; keys no query of their group sees:
    dk and dv exactly 0."""
    allowed = allowed.expand(out.shape[0], out.shape[1], -1, -1)
    empty = ~allowed.any(-1)
    unseen = ~allowed.unflatten(1, (heads_kv, -1)).any(2).any(-2)
    assert (out[empty] == 0).all() and torch.isneginf(lse[empty]).all() and torch.isfinite(lse[~empty]).all()
    dq, dk, dv = grads
    assert (dq[empty] == 0).all() and (dk[unseen] == 0).all() and (dv[unseen] == 0).all()


def reference_against_float64_softmax(q, k, v, dout, mask, allowed) -> tuple:
    """The reference's out, lse and gradients (scale 0.2), asserted against float64 softmax attention under the dense
    ``allowed``; also returns which rows see a key."""
    out, lse = reference.attention_forward(q, k, v, mask, 0.2)
    grads = reference.attention_backward(dout, q, k, v, out, lse, mask, 0.2)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    gold, gold_lse = naive_attention(*leaves, allowed, 0.2)
    gold.backward(dout)
    live = torch.isfinite(gold_lse)
    assert relative_error(out, gold) < 1e-12
    assert relative_error(lse[live], gold_lse[live]) < 1e-7  # lse is float32 for every input dtype
    for name, grad, leaf in zip(("dq", "dk", "dv"), grads, leaves):
        assert relative_error(grad, leaf.grad) < 1e-6, name  # the backward reads the float32 lse
    return out, lse, grads, live


@pytest.mark.parametrize("case", attention_cases(), ids=attention_case_id)
def test_reference_matches_float64_softmax_across_row_chunks_with_gqa_and_empty_rows(case, monkeypatch):
    kind, heads_q, heads_kv, q_len, kv_len, blocks, chunk_rows, seed = case
    mask, allowed = attention_mask_of(kind, 2, heads_q, q_len, kv_len, blocks, seed)
    q, k, v, dout = random_inputs(2, heads_q, heads_kv, q_len, kv_len, 32, seed)
    shrink_reference_chunks(monkeypatch, chunk_rows, 2, heads_q, kv_len)
    out, lse, grads, live = reference_against_float64_softmax(q, k, v, dout, mask, allowed)
    if kind == "token rule with padding":
        assert (~live).any(), "the first query row is padding"
    assert_structural_zeros(out, lse, grads, allowed, heads_kv)


@pytest.mark.parametrize("blocks", [(64, 64), (128, 128), (64, 128)])
@pytest.mark.parametrize("q_len", [1, 150, 333])
def test_reference_with_the_window_over_groups_matches_float64_softmax(blocks, q_len, monkeypatch):
    """The reference under a ``window_covers_groups`` mask (window 45 against images of 50 to 200 keys in packed
    documents, a padding row, GQA 4:2, batch 2, q_len <= kv_len 333 across blocks and the reference's row chunks)
    against float64 softmax under the brute-force rule."""
    seed = 77 + q_len + blocks[0] + 2 * blocks[1]
    doc, grp = packed_vlm_ids(2, 333, seed, doc_range=(60, 250), text_range=(1, 40), image_range=(50, 200),
                              padded=False)
    if q_len > 1:
        doc[:, 333 - q_len] = -1  # the first query row is padding
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, block_size=blocks, window=45, window_covers_groups=True)
    allowed = token_rule_dense(doc, grp, q_len, 45, window_covers_groups=True)
    assert not torch.equal(allowed, token_rule_dense(doc, grp, q_len, 45)), "the groups should outreach the window"
    q, k, v, dout = random_inputs(2, 4, 2, q_len, 333, 32, seed)
    shrink_reference_chunks(monkeypatch, 13, 2, 4, 333)
    out, lse, grads, live = reference_against_float64_softmax(q, k, v, dout, mask, allowed)
    assert live.sum() >= q_len, "most rows should see keys"
    assert_structural_zeros(out, lse, grads, allowed, 2)


@pytest.mark.parametrize("case", attention_cases()[::2], ids=attention_case_id)
def test_omni_attention_on_cpu_matches_float64_softmax_with_autograd(case, monkeypatch):
    """The public op (reference backend, float32) through autograd, the reference's chunks crossed."""
    kind, heads_q, heads_kv, q_len, kv_len, blocks, chunk_rows, seed = case
    mask, allowed = attention_mask_of(kind, 2, heads_q, q_len, kv_len, blocks, seed)
    q, k, v, dout = random_inputs(2, heads_q, heads_kv, q_len, kv_len, 32, seed, torch.float32)
    shrink_reference_chunks(monkeypatch, chunk_rows, 2, heads_q, kv_len)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = omni_attention(*leaves, mask, scale=0.2, return_lse=True)
    out.backward(dout)
    exact = [x.double().requires_grad_() for x in (q, k, v)]
    gold, gold_lse = naive_attention(*exact, allowed, 0.2)
    gold.backward(dout.double())
    assert relative_error(out, gold) < 1e-6
    live = torch.isfinite(gold_lse)
    assert torch.equal(torch.isfinite(lse), live) and relative_error(lse[live], gold_lse[live]) < 1e-6
    for name, leaf, gold_leaf in zip(("dq", "dk", "dv"), leaves, exact):
        assert relative_error(leaf.grad, gold_leaf.grad) < 1e-5, name
    assert_structural_zeros(out.detach(), lse, [x.grad for x in leaves], allowed, heads_kv)


# ---------------------------------------------------------------------- real size: several default chunks

REAL_SIZE_ROWS = [(start - 5, start + 70) for start in (1024, 2048, 3072)] + [(4090, 4097)]  # dense_rows is slow here


@pytest.mark.slow
def test_from_dense_is_exact_at_real_size_across_default_chunks():
    """2 x 2 heads x 4097 tokens: five default row chunks of eight block rows, a pool shared across them."""
    dense = random_dense(2, 2, 4097, 4097, 128, 128, seed=4097)
    mask = OmniBlockMask.from_dense(dense)
    assert dense_module.DENSE_CHUNK_ELEMENTS // (2 * 2 * 128 * 4097) < mask.num_q_blocks // 2  # several chunks
    assert_mask_is(mask, dense, row_ranges=REAL_SIZE_ROWS)


@pytest.mark.slow
def test_from_mask_fn_is_exact_at_real_size_across_default_chunks():
    """A mask_mod of the batch and head index, batch 2 x 2 heads x 4097 tokens: five default row chunks."""
    rows_seen = []

    def mask_mod(b, h, q_idx, kv_idx):
        rows_seen.append(q_idx.numel())
        return ((q_idx >= kv_idx) & ((q_idx // 700) == (kv_idx // 700) + b)) | ((kv_idx + h) % 301 == 0)

    mask = OmniBlockMask.from_mask_fn(mask_mod, 4097, 4097, batch=2, heads=2)
    assert len(rows_seen) > 2
    b, h = torch.arange(2)[:, None, None, None], torch.arange(2)[None, :, None, None]
    assert_mask_is(mask, mask_mod(b, h, torch.arange(4097)[:, None], torch.arange(4097)[None]),
                   row_ranges=REAL_SIZE_ROWS)


def test_from_token_ids_is_exact_at_real_size():
    doc, grp = random_token_ids(2, 4097, seed=4097)
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=3001, window=1500, block_size=(64, 128))
    assert_mask_is(mask, token_rule_dense(doc, grp, 3001, 1500), row_ranges=[(1019, 1094), (2043, 2118), (2990, 3001)])


@pytest.mark.slow
def test_reference_forward_is_exact_at_real_size_across_default_chunks():
    """Batch 2, 4 query heads, 4097 tokens: nine default chunks of 512 rows; float64 against the naive softmax on
    the rows around every chunk boundary."""
    doc, grp = random_token_ids(2, 4097, seed=11)
    mask = OmniBlockMask.from_token_ids(doc, grp)
    q, k, v, _ = random_inputs(2, 4, 1, 4097, 4097, 16, seed=11)
    rows_per_chunk = reference._CHUNK_ELEMENTS // (2 * 4 * 4097)
    assert rows_per_chunk < 4097 // 4
    out, lse = reference.attention_forward(q, k, v, mask)
    rows = torch.cat([torch.arange(max(0, s - 3), min(4097, s + 3)) for s in range(0, 4097, rows_per_chunk)])
    rows = torch.cat([rows, torch.arange(4090, 4097)]).unique()
    allowed = token_rule_dense(doc, grp, 4097)[:, :, rows]
    gold, gold_lse = naive_attention(q[:, :, rows], k, v, allowed, 16 ** -0.5)
    live = torch.isfinite(gold_lse)
    assert relative_error(out[:, :, rows], gold) < 1e-12
    assert torch.equal(torch.isfinite(lse[:, :, rows]), live)
    assert relative_error(lse[:, :, rows][live], gold_lse[live]) < 1e-7  # float32
