"""OmniBlockMask: every builder against a brute-force evaluation of its own definition."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_hf import BlockType, OmniBlockMask, token_ids_from_spans
from omni_hf.kernels.token_mask import token_mask
from omni_hf.mask import RANGE_INEXACT, token_ranges
from tests.helpers.brute_force import causal_dense, packed_vlm_ids, random_token_ids, spans_dense, token_rule_dense

SETTINGS = settings(max_examples=40, deadline=None)
block_sizes = st.sampled_from([64, 128])


@st.composite
def lengths(draw, max_len=400):
    """(q_len, kv_len) with q_len <= kv_len, often not multiples of a block."""
    kv_len = draw(st.integers(1, max_len))
    q_len = draw(st.one_of(st.just(kv_len), st.just(1), st.integers(1, kv_len)))
    return q_len, kv_len


@st.composite
def token_ids(draw, max_len=400):
    """Random packed documents (some padding) with random image spans: int32 [B, S] doc and group ids."""
    batch = draw(st.integers(1, 2))
    seq_len = draw(st.integers(1, max_len))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    docs, groups = [], []
    for _ in range(batch):
        cuts = torch.randint(0, seq_len + 1, (draw(st.integers(0, 4)),), generator=gen).sort().values.tolist()
        doc = torch.empty(seq_len, dtype=torch.int32)
        for index, (a, b) in enumerate(zip([0, *cuts], [*cuts, seq_len])):
            doc[a:b] = index
        doc[seq_len - int(torch.randint(0, seq_len // 3 + 1, (), generator=gen)):] = -1  # tail padding
        grp = torch.full((seq_len,), -1, dtype=torch.int32)
        for group in range(draw(st.integers(0, 5))):
            a = int(torch.randint(0, seq_len, (), generator=gen))
            b = min(seq_len, a + int(torch.randint(1, 200, (), generator=gen)))
            grp[a:b] = group
        docs.append(doc)
        groups.append(grp)
    return torch.stack(docs), torch.stack(groups)


def block_types_by_definition(dense: torch.Tensor, block_q: int, block_kv: int) -> torch.Tensor:
    """The tightest type of every block of a dense [B, H, Sq, Skv] mask, block by block in Python."""
    batch, heads, q_len, kv_len = dense.shape
    causal = causal_dense(q_len, kv_len)
    nq, nk = -(-q_len // block_q), -(-kv_len // block_kv)
    types = torch.empty(batch, heads, nq, nk, dtype=torch.int8)
    for qb in range(nq):
        for kb in range(nk):
            rows, cols = slice(qb * block_q, (qb + 1) * block_q), slice(kb * block_kv, (kb + 1) * block_kv)
            tile, tri = dense[:, :, rows, cols], causal[rows, cols]
            for b in range(batch):
                for h in range(heads):
                    t = tile[b, h]
                    kind = (BlockType.MASKED if not t.any() else BlockType.FULL if t.all()
                            else BlockType.CAUSAL if torch.equal(t, tri) else BlockType.PARTIAL)
                    types[b, h, qb, kb] = kind
    return types


def random_block_mixture(batch, heads, q_len, kv_len, block_q, block_kv, gen) -> torch.Tensor:
    """Dense mask drawn block by block as empty / full / causal triangle / random pattern."""
    dense = torch.zeros(batch, heads, q_len, kv_len, dtype=torch.bool)
    causal = causal_dense(q_len, kv_len)
    for qb in range(-(-q_len // block_q)):
        for kb in range(-(-kv_len // block_kv)):
            rows, cols = slice(qb * block_q, (qb + 1) * block_q), slice(kb * block_kv, (kb + 1) * block_kv)
            kind = int(torch.randint(0, 4, (), generator=gen))
            shape = dense[:, :, rows, cols].shape
            dense[:, :, rows, cols] = [torch.zeros(shape, dtype=torch.bool), torch.ones(shape, dtype=torch.bool),
                                       causal[rows, cols].expand(shape),
                                       torch.rand(shape, generator=gen) < 0.3][kind]
    return dense


# ---------------------------------------------------------------------- builders vs definitions


@SETTINGS
@given(lengths(), block_sizes, block_sizes)
def test_causal_matches_bottom_right_triangle(sizes, block_q, block_kv):
    q_len, kv_len = sizes
    mask = OmniBlockMask.causal(q_len, kv_len, block_size=(block_q, block_kv))
    assert torch.equal(mask.to_dense()[0, 0], causal_dense(q_len, kv_len))
    mask.validate()


@SETTINGS
@given(lengths(), block_sizes, block_sizes, st.integers(1, 300))
def test_causal_sliding_window_matches_definition(sizes, block_q, block_kv, window):
    q_len, kv_len = sizes
    mask = OmniBlockMask.causal(q_len, kv_len, block_size=(block_q, block_kv), window=window)
    qpos = torch.arange(q_len)[:, None] + kv_len - q_len
    j = torch.arange(kv_len)[None]
    assert torch.equal(mask.to_dense()[0, 0], (j <= qpos) & (qpos - j < window))


@SETTINGS
@given(token_ids(), block_sizes, block_sizes, st.data())
def test_from_token_ids_matches_token_rule(ids, block_q, block_kv, data):
    doc, grp = ids
    q_len = data.draw(st.integers(1, doc.shape[1]))
    window = data.draw(st.one_of(st.none(), st.integers(1, 300)))
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, block_size=(block_q, block_kv), window=window)
    mask.validate()
    assert torch.equal(mask.to_dense(), token_rule_dense(doc, grp, q_len, window))


@SETTINGS
@given(token_ids(), block_sizes)
def test_from_token_ids_claims_full_and_causal_only_where_exact(ids, block):
    """The summary-based classifier may leave a block PARTIAL, but every FULL / CAUSAL / absent claim
    must equal the tightest classification of the dense mask."""
    doc, grp = ids
    mask = OmniBlockMask.from_token_ids(doc, grp, block_size=block)
    claimed, _ = mask.block_table()
    tight = block_types_by_definition(token_rule_dense(doc, grp, doc.shape[1]), block, block)
    decided = claimed != BlockType.PARTIAL
    assert torch.equal(claimed[decided], tight[decided])


@SETTINGS
@given(lengths(max_len=300), block_sizes, block_sizes, st.integers(1, 2), st.integers(1, 2), st.integers(0, 2**31 - 1))
def test_from_dense_classifies_tightest_and_round_trips(sizes, block_q, block_kv, batch, heads, seed):
    q_len, kv_len = sizes
    dense = random_block_mixture(batch, heads, q_len, kv_len, block_q, block_kv, torch.Generator().manual_seed(seed))
    mask = OmniBlockMask.from_dense(dense, block_size=(block_q, block_kv))
    mask.validate()
    assert torch.equal(mask.to_dense(), dense)
    types, pool_ids = mask.block_table()
    assert torch.equal(types, block_types_by_definition(dense, block_q, block_kv))
    assert mask.partial_pool.shape[0] == torch.unique(pool_ids[types == BlockType.PARTIAL]).numel()
    again = OmniBlockMask.from_dense(mask.to_dense(), block_size=(block_q, block_kv))
    assert torch.equal(again.to_dense(), dense)


def test_from_dense_keeps_pool_ids_on_their_blocks_across_row_chunks_with_batch_and_heads(monkeypatch):
    """Regression: pool patterns were concatenated chunk by chunk but assigned in batch-major order, so a mask
    of batch x heads > 1 classified in several row chunks came back wrong."""
    import omni_hf.mask.dense as dense_module

    monkeypatch.setattr(dense_module, "DENSE_CHUNK_ELEMENTS", 2 * 3 * 64 * 300)  # one block row per chunk
    dense = torch.rand(2, 3, 300, 300, generator=torch.Generator().manual_seed(3)) < 0.9
    mask = OmniBlockMask.from_dense(dense, block_size=64)
    mask.validate()
    assert torch.equal(mask.to_dense(), dense)


@pytest.mark.slow
def test_from_dense_is_exact_at_real_size_with_batch_two():
    """The issue's repro at its own size: 2 x 3000 x 3000 spans several default row chunks."""
    dense = torch.rand(2, 1, 3000, 3000, generator=torch.Generator().manual_seed(0)) < 0.9
    assert torch.equal(OmniBlockMask.from_dense(dense).to_dense(), dense)


def test_token_ids_with_a_batch_of_one_broadcast_against_the_other():
    """Regression: Transformers hands per-row image ids [B, S] beside document ids of one row [1, S]."""
    doc = torch.zeros(1, 200, dtype=torch.int32)
    grp = torch.full((3, 200), -1, dtype=torch.int32)
    grp[0, 10:50], grp[2, 100:180] = 0, 1
    mask = OmniBlockMask.from_token_ids(doc, grp, block_size=64)
    assert mask.batch == 3
    assert torch.equal(mask.to_dense(), token_rule_dense(doc.expand(3, -1), grp, 200))
    with pytest.raises(ValueError, match="group_ids: expected the shape of doc_ids"):
        OmniBlockMask.from_token_ids(torch.zeros(3, 200, dtype=torch.int32), grp[:2])


def test_from_dense_deduplicates_identical_partial_blocks():
    pattern = torch.rand(64, 64, generator=torch.Generator().manual_seed(0)) < 0.5
    dense = pattern.repeat(3, 3)  # nine identical partial blocks
    mask = OmniBlockMask.from_dense(dense, block_size=64)
    assert mask.partial_pool.shape[0] == 1
    assert int(mask.kv.num_blocks.sum()) == 9
    assert torch.equal(mask.to_dense()[0, 0], dense)


@SETTINGS
@given(lengths(max_len=300), block_sizes, block_sizes, st.integers(1, 64))
def test_from_mask_fn_matches_mask_mod(sizes, block_q, block_kv, period):
    q_len, kv_len = sizes

    def mask_mod(b, h, q_idx, kv_idx):
        return ((q_idx // period) == (kv_idx // period)) | ((kv_idx + h) % 3 == b)

    mask = OmniBlockMask.from_mask_fn(mask_mod, q_len, kv_len, batch=2, heads=3, block_size=(block_q, block_kv))
    b, h = torch.arange(2)[:, None, None, None], torch.arange(3)[None, :, None, None]
    q, kv = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
    assert torch.equal(mask.to_dense(), mask_mod(b, h, q, kv))


def test_from_mask_fn_evaluates_tile_rows_not_the_whole_grid(monkeypatch):
    import omni_hf.mask.dense as dense_module

    monkeypatch.setattr(dense_module, "DENSE_CHUNK_ELEMENTS", 128 * 1000)
    seen = []

    def mask_mod(b, h, q_idx, kv_idx):
        seen.append(q_idx.numel())
        return q_idx >= kv_idx

    mask = OmniBlockMask.from_mask_fn(mask_mod, 1000, 1000)
    assert max(seen) <= 128 and len(seen) == 8
    assert torch.equal(mask.to_dense()[0, 0], causal_dense(1000, 1000))


@st.composite
def packed_rows(draw):
    """Rows of packed samples with sorted image spans inside each sample."""
    seq_len = draw(st.integers(8, 300))
    spans, samples = [], []
    for _ in range(draw(st.integers(1, 3))):
        lengths, row_spans, start = [], [], 0
        while start < seq_len and draw(st.booleans()):
            length = draw(st.integers(1, seq_len - start))
            cursor = start
            while cursor < start + length - 1 and draw(st.booleans()):
                a = draw(st.integers(cursor, start + length - 1))
                b = draw(st.integers(a + 1, start + length))
                row_spans.append((a, b))
                cursor = b
            lengths.append(length)
            start += length
        spans.append(row_spans)
        samples.append(lengths or [seq_len])
    return spans, seq_len, samples


@SETTINGS
@given(packed_rows(), block_sizes)
def test_from_spans_matches_spans_definition(rows, block):
    spans, seq_len, samples = rows
    mask = OmniBlockMask.from_spans(spans, seq_len, sample_lengths=samples, block_size=block)
    assert torch.equal(mask.to_dense(), spans_dense(spans, seq_len, samples))


@pytest.mark.parametrize("spans, samples, message", [
    ([[(5, 3)]], None, "start < end"),
    ([[(0, 30)]], None, "start < end"),
    ([[(4, 8), (6, 10)]], None, "non-overlapping"),
    ([[(6, 10), (0, 4)]], None, "non-overlapping"),
    ([[(8, 12)]], [[10, 10]], "crosses"),
    ([[]], [[15, 10]], "sample_lengths"),
])
def test_from_spans_rejects_bad_spans(spans, samples, message):
    with pytest.raises(ValueError, match=message):
        token_ids_from_spans(spans, 20, samples)


# ---------------------------------------------------------------------- broadcasting, views, conversions


def test_batch_and_head_broadcast_equals_expanded_mask():
    gen = torch.Generator().manual_seed(1)
    dense = random_block_mixture(1, 1, 200, 200, 64, 64, gen)
    small = OmniBlockMask.from_dense(dense, block_size=64)
    expanded = OmniBlockMask.from_dense(dense.expand(3, 4, -1, -1).clone(), block_size=64)
    assert small.batch == 1 and small.heads == 1 and expanded.batch == 3 and expanded.heads == 4
    assert torch.equal(small.to_dense().expand(3, 4, -1, -1), expanded.to_dense())


def test_column_view_lists_the_same_blocks_as_the_row_view():
    dense = random_block_mixture(2, 1, 300, 250, 128, 64, torch.Generator().manual_seed(2))
    mask = OmniBlockMask.from_dense(dense, block_size=(128, 64))
    row_types, _ = mask.block_table()
    for b in range(2):
        for kb in range(mask.num_kv_blocks):
            count = int(mask.q.num_blocks[b, 0, kb])
            listed = mask.q.indices[b, 0, kb, :count].tolist()
            assert listed == sorted(listed)
            assert listed == torch.nonzero(row_types[b, 0, :, kb] != BlockType.MASKED).flatten().tolist()
            assert mask.q.types[b, 0, kb, :count].tolist() == row_types[b, 0, listed, kb].tolist()


def test_token_ids_shapes_depend_only_on_sizes():
    """Fixed output shapes: different contents of the same size give identically shaped masks."""
    a = OmniBlockMask.from_token_ids(torch.zeros(1, 1000, dtype=torch.int32))
    doc = torch.arange(1000, dtype=torch.int32)[None] // 100
    b = OmniBlockMask.from_token_ids(doc, doc % 3 - 1)
    for field in dataclasses.fields(a):
        value = getattr(a, field.name)
        if isinstance(value, torch.Tensor):
            assert value.shape == getattr(b, field.name).shape, field.name


def test_describe_draws_the_causal_picture():
    text = OmniBlockMask.causal(256, 256, block_size=64).describe()
    header, *rows = text.splitlines()
    assert rows == ["C...", "FC..", "FFC.", "FFFC"]
    assert "F=6" in header and "C=4" in header and ".=6" in header


def test_to_and_pin_memory_keep_the_mask():
    mask = OmniBlockMask.from_token_ids(torch.tensor([[0] * 100 + [1] * 50]),
                                        torch.tensor([[-1] * 20 + [0] * 60 + [-1] * 70]), block_size=64)
    moved = mask.to("cpu", non_blocking=True)
    assert torch.equal(moved.to_dense(), mask.to_dense())
    if torch.cuda.is_available():
        pinned = mask.pin_memory()
        assert pinned.kv.indices.is_pinned() and torch.equal(pinned.to_dense(), mask.to_dense())


def test_flex_round_trip_keeps_the_element_rule():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    doc = torch.tensor([[0] * 150 + [1] * 100 + [-1] * 20], dtype=torch.int32)
    grp = torch.tensor([[-1] * 30 + [0] * 70 + [-1] * 80 + [1] * 40 + [-1] * 50], dtype=torch.int32)
    mask = OmniBlockMask.from_token_ids(doc, grp, block_size=128)
    block_mask = mask.to_flex()
    back = OmniBlockMask.from_flex(block_mask, block_size=64)
    assert torch.equal(back.to_dense(), token_rule_dense(doc, grp, 270))
    q, k, v = (torch.randn(1, 2, 270, 16) for _ in range(3))
    out = flex.flex_attention(q, k, v, block_mask=block_mask)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=token_rule_dense(doc, grp, 270))
    live = token_rule_dense(doc, grp, 270).any(-1)[..., None].expand_as(out)
    torch.testing.assert_close(out[live], expected[live], rtol=1e-5, atol=1e-5)


def test_from_flex_matches_create_block_mask_semantics():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & ((q_idx - kv_idx) % 7 != 3)

    block_mask = flex.create_block_mask(mask_mod, None, None, 300, 300, device="cpu")
    mask = OmniBlockMask.from_flex(block_mask)
    q, kv = torch.arange(300)[:, None], torch.arange(300)[None]
    assert torch.equal(mask.to_dense()[0, 0], mask_mod(0, 0, q, kv))


# ---------------------------------------------------------------------- validate


def corrupt(mask: OmniBlockMask, part: str, **changes) -> OmniBlockMask:
    """``mask`` with fields of its named part (``kv``, ``q``, ``token_rule``, or ``mask`` itself) changed."""
    if part == "mask":
        return dataclasses.replace(mask, **changes)
    return dataclasses.replace(mask, **{part: dataclasses.replace(getattr(mask, part), **changes)})


def test_validate_reports_each_broken_invariant():
    dense = random_block_mixture(1, 1, 256, 256, 64, 64, torch.Generator().manual_seed(3))
    dense[0, 0, :64, :64] = torch.rand(64, 64, generator=torch.Generator().manual_seed(4)) < 0.5  # one pooled block
    mask = OmniBlockMask.from_dense(dense, block_size=64)
    mask.validate()
    row = int(torch.nonzero(mask.kv.num_blocks[0, 0] >= 2)[0])
    bad_index = mask.kv.indices.clone()
    bad_index[0, 0, row, 0] = 99
    with pytest.raises(ValueError, match="kv.indices: expected active indices in"):
        corrupt(mask, "kv", indices=bad_index).validate()
    swapped = mask.kv.indices.clone()
    swapped[0, 0, row, :2] = swapped[0, 0, row, :2].flip(0)
    with pytest.raises(ValueError, match="ascending"):
        corrupt(mask, "kv", indices=swapped).validate()
    with pytest.raises(ValueError, match="kv.num_blocks: expected counts"):
        corrupt(mask, "kv", num_blocks=mask.kv.num_blocks + 10).validate()
    bad_pool = torch.where(mask.kv.types == BlockType.PARTIAL, 7, mask.kv.partial)
    with pytest.raises(ValueError, match="kv.partial: expected pool ids"):
        corrupt(mask, "kv", partial=bad_pool).validate()
    with pytest.raises(ValueError, match="column view"):
        corrupt(mask, "q", types=torch.where(mask.q.types == BlockType.FULL, BlockType.CAUSAL,
                                             mask.q.types).to(torch.int8)).validate()
    token_mask = OmniBlockMask.from_token_ids(torch.tensor([[0] * 100 + [1] * 100]),
                                              torch.tensor([[-1] * 50 + [0] * 100 + [-1] * 50]), block_size=64)
    with pytest.raises(ValueError, match="token rule"):
        corrupt(token_mask, "mask", token_rule=None).validate()
    with pytest.raises(ValueError, match="partial_pool"):
        corrupt(mask, "mask", partial_pool=mask.partial_pool[:, :32]).validate()


@pytest.mark.parametrize("call, message", [
    (lambda: OmniBlockMask.causal(0), "q_len: expected a positive int"),
    (lambda: OmniBlockMask.causal(100, block_size=32), r"block_size: expected one of \(64, 128\) .*got 32"),
    (lambda: OmniBlockMask.causal(100, block_size=(128, 256)), r"block_size: .*got \(128, 256\)"),
    (lambda: OmniBlockMask.causal(100, block_size=(64, 64, 64)), "block_size: expected one of"),
    (lambda: OmniBlockMask.from_token_ids(torch.zeros(2, 10)), "doc_ids: expected an integer tensor"),
    (lambda: OmniBlockMask.from_token_ids(torch.zeros(2, 10, dtype=torch.int32), torch.zeros(2, 9, dtype=torch.int32)),
     "group_ids: expected the shape"),
    (lambda: OmniBlockMask.from_token_ids(torch.zeros(1, 10, dtype=torch.int32), q_len=11), "q_len: expected at most"),
    (lambda: OmniBlockMask.from_token_ids(torch.zeros(1, 10, dtype=torch.int32), window=0), "window: expected"),
    (lambda: OmniBlockMask.from_token_ids(torch.zeros(1, 10, dtype=torch.int32), window=4, window_covers_groups=1),
     "window_covers_groups: expected a bool, got int"),
    (lambda: OmniBlockMask.from_dense(torch.ones(3, 4)), "dense: expected a bool tensor"),
    (lambda: OmniBlockMask.from_dense(torch.ones(2, 3, 4, dtype=torch.bool)), "dense: expected shape"),
])
def test_builders_reject_bad_input(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("doc, grp, message", [
    ([[0, 0, -5, 1, 1]], None, r"doc_ids: expected ids >= -1 \(-1 = padding\), got -5 at \[0, 2\]"),
    ([[0, 0, 1, 1, -1], [0, 1, 1, 1, 1]], [[-1, 0, 0, -1, -1], [-1, -1, -3, -1, 0]],
     r"group_ids: expected ids >= -1 \(-1 = causal text\), got -3 at \[1, 2\]"),
])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_token_ids_below_minus_one_are_refused_naming_the_value_and_where(doc, grp, message, dtype):
    doc, grp = torch.tensor(doc, dtype=dtype), None if grp is None else torch.tensor(grp, dtype=dtype)
    with pytest.raises(ValueError, match=message):
        OmniBlockMask.from_token_ids(doc, grp)


@pytest.mark.parametrize("block_size", [(64, 128), (128, 64), 64])
def test_block_size_pair_sets_each_side_and_keeps_the_rule(block_size):
    doc, grp = packed_vlm_ids(2, 300, seed=5)
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=250, block_size=block_size)
    block_q, block_kv = block_size if isinstance(block_size, tuple) else (block_size, block_size)
    assert (mask.block_q, mask.block_kv) == (block_q, block_kv)
    assert (mask.num_q_blocks, mask.num_kv_blocks) == (-(-250 // block_q), -(-300 // block_kv))
    mask.validate()
    assert torch.equal(mask.to_dense(), token_rule_dense(doc, grp, 250))
    dense = token_rule_dense(doc, grp, 300)
    assert torch.equal(OmniBlockMask.from_dense(dense, block_size=block_size).to_dense(), dense)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "reference"])  # the library's build where it loads; PyTorch ops
def test_from_token_ids_on_the_gpu_never_syncs_and_equals_the_cpu_build(backend, monkeypatch):
    monkeypatch.setenv("OMNI_HF_BACKEND", backend)
    doc = torch.arange(5000, dtype=torch.int32)[None] // 1300
    grp = torch.where((torch.arange(5000) % 1000) > 700, torch.arange(5000) // 1000, -1).int()[None]
    for window, covers in ((2048, False), (200, True)):  # the window over the causal part, or groups of 299 too
        args = dict(q_len=4000, window=window, window_covers_groups=covers)
        expected = OmniBlockMask.from_token_ids(doc, grp, **args)
        doc_gpu, grp_gpu = doc.cuda(), grp.cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            mask = OmniBlockMask.from_token_ids(doc_gpu, grp_gpu, **args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        (tensors, sizes), (expected_tensors, expected_sizes) = mask.as_tuple(), expected.as_tuple()
        assert sizes == expected_sizes
        for index, (value, want) in enumerate(zip(tensors, expected_tensors, strict=True)):
            assert value.is_cuda and torch.equal(value.cpu(), want), index


@pytest.mark.gpu
@settings(max_examples=60, deadline=None)
@given(token_ids(max_len=3000), block_sizes, block_sizes, st.data())
def test_library_token_mask_build_equals_the_pytorch_build(ids, block_q, block_kv, data):
    """omni_build_token_mask against the PyTorch build (itself tested against the token rule above), byte
    for byte on every field, entries past the counts included, and the token ranges."""
    doc, grp = ids
    q_len = data.draw(st.integers(1, doc.shape[1]))
    window = data.draw(st.one_of(st.none(), st.integers(1, 3000)))
    covers = data.draw(st.booleans(), "window_covers_groups")
    args = dict(q_len=q_len, block_size=(block_q, block_kv), window=window, window_covers_groups=covers)
    expected = OmniBlockMask.from_token_ids(doc, grp, **args)
    built = token_mask(doc.cuda(), grp.cuda(), q_len, block_q, block_kv, window, covers)
    mask = OmniBlockMask.from_token_ids(doc.cuda(), grp.cuda(), **args)
    expected_tensors, _ = expected.as_tuple()
    wanted = [*expected_tensors[:8], expected_tensors[-1]]  # the two views, then the token ranges
    for index, (value, want) in enumerate(zip(built, wanted, strict=True)):
        assert torch.equal(value.cpu(), want), index
    for index, (value, want) in enumerate(zip(mask.as_tuple()[0], expected_tensors, strict=True)):
        assert torch.equal(value.cpu(), want), index
    mask.validate()


@pytest.mark.gpu
@pytest.mark.parametrize("length", [2047, 2048, 2049, 4097, 8197, 40000])  # the library scans chunks of 2048
@pytest.mark.parametrize("ids", ["packed", "random"])
@pytest.mark.parametrize("window, covers", [(None, False), (1000, False), (1000, True)])
def test_library_token_ranges_equal_the_pytorch_ones_across_scan_chunks(length, ids, window, covers):
    """Runs of documents and images that cross the library's scan chunks, in rows with ranges (packed) and rows
    mostly without (random: shared and split ids), batch 3."""
    doc, grp = (packed_vlm_ids(3, length, seed=length, doc_range=(100, 9000), image_range=(30, 5000), gaps=True)
                if ids == "packed" else random_token_ids(3, length, seed=length))
    expected = token_ranges(doc, grp, window, covers)
    *_, built = token_mask(doc.cuda(), grp.cuda(), length, 128, 128, window, covers)
    assert torch.equal(built.cpu(), expected)
    if ids == "packed":
        assert bool((expected != RANGE_INEXACT).all())
