"""GPU tests of the forward kernels against the exact PyTorch reference (skipped without CUDA or the library).
Every test poisons the outputs with NaN before the kernel runs and checks every element. On a Hopper GPU each
test runs twice: through the sm_90a kernel (which takes mask blocks of 128 keys and falls back to sm_80 for the
rest) and with OMNI_HF_DISABLE_SM90=1, through the sm_80 kernel."""

from __future__ import annotations

import math
import re

import pytest
import torch

from omni_hf import OmniBlockMask
from omni_hf.mask import RANGE_INEXACT
from omni_hf.ops import library
from tests.helpers.brute_force import packed_vlm_ids, without_ranges
from tests.helpers.gpu_paths import is_hopper, kernel_names
from tests.helpers.kernel_checks import (
    LSE_ATOL,
    LSE_ATOL_SOFTCAP,
    _gen,
    _qkv,
    assert_matches_reference,
    random_block_dense,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("kernel_path", "poisoned_outputs")]

DTYPES = (torch.float16, torch.bfloat16)
BLOCKS = ((128, 128), (64, 64), (64, 128), (128, 64))


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("dim", (64, 96, 128))
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_mixture_of_every_block_type(dtype, dim, blocks):
    block_q, block_kv = blocks
    q_len, kv_len = (1000, 1000) if block_q == block_kv else (700, 1000)
    dense = random_block_dense(1, 4, q_len, kv_len, block_q, block_kv, seed=dim + block_q + block_kv)
    mask = OmniBlockMask.from_dense(dense, block_size=(block_q, block_kv))
    active = torch.arange(mask.kv.indices.shape[-1], device="cuda") < mask.kv.num_blocks[..., None]
    types = set(mask.kv.types[active].tolist())
    assert {1, 2, 3} <= types, f"the draw should hold FULL, CAUSAL and PARTIAL blocks, got {types}"
    q, k, v = _qkv(2, 4, 2, q_len, kv_len, dim, dtype, seed=1)
    assert_matches_reference(q, k, v, mask, ref_mask=dense)


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("dim", (64, 96, 128))
@pytest.mark.parametrize("dtype", DTYPES)
def test_token_rule_packed_interleaved_documents(dtype, dim, blocks):
    block_q, block_kv = blocks
    doc, grp = packed_vlm_ids(2, 1500, seed=dim + block_q, device="cuda")
    mask = OmniBlockMask.from_token_ids(doc, grp, block_size=(block_q, block_kv))
    q, k, v = _qkv(2, 4, 1, 1500, 1500, dim, dtype, seed=2)
    assert_matches_reference(q, k, v, mask, ref_mask=mask.to_dense())


@pytest.mark.parametrize("q_len", (1, 77, 300, 1500))
def test_token_rule_with_fewer_queries_than_keys(q_len):
    doc, grp = packed_vlm_ids(2, 1500, seed=q_len, padded=False, device="cuda")  # the last queries see keys
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len)
    q, k, v = _qkv(2, 2, 2, q_len, 1500, 128, torch.bfloat16, seed=3)
    assert_matches_reference(q, k, v, mask)


@pytest.mark.parametrize("window", (1, 100, 700))
def test_token_rule_with_sliding_window(window):
    doc, grp = packed_vlm_ids(1, 2000, seed=window, device="cuda")
    mask = OmniBlockMask.from_token_ids(doc, grp, window=window, block_size=(64, 128))
    q, k, v = _qkv(1, 4, 2, 2000, 2000, 64, torch.float16, seed=4)
    assert_matches_reference(q, k, v, mask)


@pytest.mark.parametrize("window, covers", ((None, False), (300, False), (60, True)))
@pytest.mark.parametrize("q_len", (700, 2000))
def test_token_ranges_mask_exactly_as_the_ids_do(window, covers, q_len):
    """Masks from from_token_ids carry token_ranges, which the sm_90a kernels test instead of the ids where a batch
    row's ids allow it (row 0); row 1 reuses document 0, so its items compare ids. Both match the reference, and the
    output is bit for bit that of the same mask without ranges (ids everywhere); also where the window (60) cuts
    image pairs (images of 30 to 200 keys) too."""
    doc, grp = packed_vlm_ids(2, 2000, seed=31, device="cuda")
    doc[1, 1500:1600] = 0
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, window=window, window_covers_groups=covers)
    assert (mask.token_rule.ranges[0] != RANGE_INEXACT).all() and (mask.token_rule.ranges[1] == RANGE_INEXACT).all()
    q, k, v = _qkv(2, 8, 2, q_len, 2000, 128, torch.bfloat16, seed=5)
    out, lse = assert_matches_reference(q, k, v, mask)
    by_ids = library.forward(q, k, v, *without_ranges(mask).as_tuple(), q.shape[-1] ** -0.5, None)
    assert torch.equal(out, by_ids[0]) and torch.equal(lse, by_ids[1])


@pytest.mark.parametrize("q_len,kv_len", [(1, 1), (1, 4100), (17, 17), (129, 129), (1000, 1000), (300, 4100),
                                          (4100, 4100), (128, 256)])
def test_causal_lengths_and_bottom_right_alignment(q_len, kv_len):
    mask = OmniBlockMask.causal(q_len, kv_len)
    q, k, v = _qkv(1, 2, 1, q_len, kv_len, 128, torch.bfloat16, seed=q_len + kv_len)
    assert_matches_reference(q, k, v, mask)


@pytest.mark.parametrize("heads_q,heads_kv", [(2, 2), (8, 2), (8, 1)])
def test_gqa_ratios(heads_q, heads_kv):
    doc, grp = packed_vlm_ids(1, 900, seed=heads_q, device="cuda")
    mask = OmniBlockMask.from_token_ids(doc, grp)
    q, k, v = _qkv(1, heads_q, heads_kv, 900, 900, 128, torch.float16, seed=5)
    assert_matches_reference(q, k, v, mask)


@pytest.mark.parametrize("blocks", ((64, 64), (128, 128)))
@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_bshd_inputs_are_read_in_place_and_out_keeps_their_layout(dtype, blocks):
    doc, grp = packed_vlm_ids(2, 1100, seed=6, device="cuda")
    mask = OmniBlockMask.from_token_ids(doc, grp, block_size=(blocks[0], blocks[1]))
    q, k, v = _qkv(2, 8, 2, 1100, 1100, 64, dtype, seed=6, bshd=True)
    assert not q.is_contiguous() and q.stride(-1) == 1
    out, _ = assert_matches_reference(q, k, v, mask)
    assert out.transpose(1, 2).is_contiguous()  # Transformers' transpose back to [B, S, H, D] copies nothing


@pytest.mark.parametrize("dim", (64, 96, 128))
def test_more_query_blocks_than_multiprocessors(dim):
    """512 CTAs of 128 query rows: several waves on any GPU, with mixed tile kinds."""
    doc, grp = packed_vlm_ids(2, 2000, seed=13, device="cuda")
    mask = OmniBlockMask.from_token_ids(doc, grp)
    q, k, v = _qkv(2, 16, 4, 2000, 2000, dim, torch.bfloat16, seed=13)
    assert_matches_reference(q, k, v, mask)


def test_concurrent_calls_on_two_streams_each_get_every_work_item():
    """The persistent Hopper forward hands out its work items from a counter in the call's own workspace: two
    calls of 512 items each (several per CTA) running at once on two streams must each compute all of theirs."""
    doc, grp = packed_vlm_ids(2, 2000, seed=21, device="cuda")
    mask = OmniBlockMask.from_token_ids(doc, grp)
    inputs = [_qkv(2, 16, 4, 2000, 2000, 128, torch.bfloat16, seed=seed) for seed in (21, 22)]
    streams = [torch.cuda.Stream() for _ in inputs]
    results = [[], []]
    torch.cuda.synchronize()
    for _ in range(3):
        for i, (stream, (q, k, v)) in enumerate(zip(streams, inputs)):
            with torch.cuda.stream(stream):
                results[i].append(library.forward(q, k, v, *mask.as_tuple(), 128 ** -0.5, None))
    torch.cuda.synchronize()
    for (q, k, v), outs in zip(inputs, results):
        want_out, want_lse = assert_matches_reference(q, k, v, mask)
        for out, lse in outs:
            assert torch.equal(out, want_out) and torch.equal(lse, want_lse), "a concurrent call differs"


@pytest.mark.parametrize("mask_kind", ("token_rule", "causal", "full"))
def test_wide_calls_run_in_l2_sections_and_every_item_is_computed(mask_kind):
    """A persistent forward over more (batch, head) pairs than one section's keys fit in L2 (3 x 12 heads of 4100
    keys at head dim 128: 15 KV heads of 2.1 MB per 32 MB section, so sections of 30 and 6 pairs) works through
    the sections in turn, the last one short; every item lands once."""
    batch, heads_q, heads_kv, length = 3, 12, 6, 4100
    if mask_kind == "token_rule":
        mask = OmniBlockMask.from_token_ids(*packed_vlm_ids(batch, length, seed=5, device="cuda"))
    else:
        mask = getattr(OmniBlockMask, mask_kind)(length, length)
    ref_mask = torch.ones(length, length, dtype=torch.bool, device="cuda") if mask_kind == "full" else None
    q, k, v = _qkv(batch, heads_q, heads_kv, length, length, 128, torch.bfloat16, seed=len(mask_kind), bshd=True)
    assert_matches_reference(q, k, v, mask, ref_mask=ref_mask)


def test_kv_cache_slice_with_padded_stride():
    cache = torch.randn(1, 2, 3000, 128, device="cuda", dtype=torch.bfloat16, generator=_gen(7))
    k, v = cache[:, :1, :2500], cache[:, 1:, :2500]
    q = torch.randn(1, 4, 40, 128, device="cuda", dtype=torch.bfloat16, generator=_gen(8))
    assert_matches_reference(q, k, v, OmniBlockMask.causal(40, 2500))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softcap_and_scale(dtype):
    dense = random_block_dense(1, 1, 600, 600, 128, 128, seed=9)
    mask = OmniBlockMask.from_dense(dense)
    q, k, v = _qkv(1, 2, 2, 600, 600, 128, dtype, seed=9)
    assert_matches_reference(q, k, v, mask, scale=0.3, softcap=15.0, ref_mask=dense, lse_atol=LSE_ATOL_SOFTCAP)


def test_fully_masked_rows_output_zero_and_lse_minus_inf():
    doc, grp = packed_vlm_ids(2, 1000, seed=10, device="cuda")
    doc[:, 200:260] = -1  # padding inside the rows: these queries see nothing
    mask = OmniBlockMask.from_token_ids(doc, grp)
    q, k, v = _qkv(2, 2, 2, 1000, 1000, 64, torch.bfloat16, seed=10)
    out, lse = assert_matches_reference(q, k, v, mask)
    assert (lse[:, :, 200:260] == -math.inf).all() and (out[:, :, 200:260] == 0).all()


def test_dense_mask_with_empty_rows_and_columns():
    dense = random_block_dense(1, 2, 500, 800, 64, 64, seed=11)
    dense[..., 10:90, :] = False
    dense[..., :, 300:420] = False
    mask = OmniBlockMask.from_dense(dense, block_size=64)
    q, k, v = _qkv(1, 2, 1, 500, 800, 128, torch.float16, seed=11)
    assert_matches_reference(q, k, v, mask, ref_mask=dense)


@pytest.mark.parametrize("mask_batch,mask_heads", [(1, 1), (2, 1), (1, 4), (2, 4)])
def test_mask_broadcast_over_batch_and_heads(mask_batch, mask_heads):
    dense = random_block_dense(mask_batch, mask_heads, 640, 640, 128, 128, seed=mask_batch * 10 + mask_heads)
    mask = OmniBlockMask.from_dense(dense)
    assert (mask.batch, mask.heads) == (mask_batch, mask_heads)
    q, k, v = _qkv(2, 4, 2, 640, 640, 64, torch.bfloat16, seed=12)
    assert_matches_reference(q, k, v, mask, ref_mask=dense)


def test_token_ids_broadcast_over_the_batch():
    doc, grp = packed_vlm_ids(1, 1200, seed=13, device="cuda")
    mask = OmniBlockMask.from_token_ids(doc, grp)
    q, k, v = _qkv(3, 2, 2, 1200, 1200, 128, torch.bfloat16, seed=13)
    assert_matches_reference(q, k, v, mask)


def test_uninstantiated_head_dim_runs_on_the_next_kernel_and_the_library_names_a_bad_one():
    """The library runs head dim 80 itself, on the 96 kernel with no copy (tests/cuda/test_head_dims.py checks every
    gradient too); handed a head dim that is not a multiple of 8, it names that check (before the strides');
    above the largest instantiation the op reports why the kernels cannot run."""
    mask = OmniBlockMask.causal(64)
    q, k, v = _qkv(1, 1, 1, 64, 64, 80, torch.bfloat16, seed=14)
    assert library.unsupported_reason(q, mask.as_tuple()[1]) is None and library.kernel_head_dim(80) == 96
    assert_matches_reference(q, k, v, mask)
    q, k, v = (t[..., :76] for t in _qkv(1, 1, 1, 64, 64, 80, torch.bfloat16, seed=14))
    with pytest.raises(RuntimeError, match="omni_fwd failed: head_dim.*head_dim=76; expected a multiple of 8"):
        library.forward(q, k, v, *mask.as_tuple(), 0.1, None)
    wide = torch.empty(1, 1, 64, library.HEAD_DIMS[-1] + 8, device="cuda", dtype=torch.bfloat16)
    assert f"head dim {wide.shape[-1]}" in library.unsupported_reason(wide, mask.as_tuple()[1])


def test_misaligned_inputs_are_copied_and_give_the_reference_result():
    """16-byte loads cannot read an 8-byte offset or odd strides: the op copies such inputs first."""
    mask = OmniBlockMask.causal(64)
    storage = torch.randn(1, 1, 64, 136, device="cuda", dtype=torch.float16, generator=_gen(15))
    q = storage[..., 4:132]  # 8-byte offset: not 16-byte aligned
    k = storage[..., :128]
    v = torch.randn(1, 1, 64 * 130, device="cuda", dtype=torch.float16, generator=_gen(16))[..., :64 * 129]
    v = v.view(1, 1, 64, 129)[..., :128]  # rows of 129 elements: strides not multiples of 8
    assert library.unsupported_reason(q, mask.as_tuple()[1]) is None
    assert_matches_reference(q, k, v, mask)


@pytest.mark.parametrize("window", (None, 1, 100, 333))
@pytest.mark.parametrize("q_len,kv_len", [(1, 1), (1, 2049), (63, 700), (700, 700), (1500, 1500), (129, 4100)])
@pytest.mark.parametrize("blocks", ((128, 128), (64, 64), (64, 128)))
def test_implicit_causal_mask_with_windows_matches_reference(blocks, q_len, kv_len, window):
    """Causal masks are implicit (no lists): the kernels derive every block, windows included."""
    mask = OmniBlockMask.causal(q_len, kv_len, window=window, block_size=(blocks[0], blocks[1]))
    q, k, v = _qkv(2, 4, 2, q_len, kv_len, 128, torch.bfloat16, seed=q_len + kv_len + (window or 0))
    assert_matches_reference(q, k, v, mask, ref_mask=mask.to_dense("cuda"))


@pytest.mark.parametrize("q_len,kv_len", [(1, 1), (1, 2049), (700, 300), (1000, 1000), (129, 4100)])
@pytest.mark.parametrize("dim", (64, 96, 128))
def test_implicit_full_mask_matches_reference(q_len, kv_len, dim):
    mask = OmniBlockMask.full(q_len, kv_len)
    q, k, v = _qkv(2, 4, 4, q_len, kv_len, dim, torch.float16, seed=q_len * 3 + kv_len)
    assert_matches_reference(q, k, v, mask, ref_mask=torch.ones(q_len, kv_len, dtype=torch.bool, device="cuda"))


def _forward_kernel_names(q, k, v, mask, softcap=None) -> list[str]:
    return kernel_names(lambda: library.forward(q, k, v, *mask.as_tuple(), q.shape[-1] ** -0.5, softcap), "fwd_kernel")


@pytest.mark.skipif(not is_hopper(), reason="needs a compute capability 9.0 GPU")
@pytest.mark.parametrize("blocks,hopper_kernel", [((128, 128), True), ((64, 128), True), ((64, 64), False),
                                                  ((128, 64), False)])
def test_hopper_kernel_takes_128_key_blocks_and_the_switch_turns_it_off(kernel_path, blocks, hopper_kernel):
    """The sm_90a kernel takes mask blocks of 128 keys (64 or 128 rows) on Hopper; others and the switch fall back."""
    q, k, v = _qkv(1, 2, 1, 300, 300, 64, torch.bfloat16, seed=12)
    names = _forward_kernel_names(q, k, v, OmniBlockMask.causal(300, 300, block_size=(blocks[0], blocks[1])))
    assert len(names) == 1 and ("sm90::" in names[0]) == (hopper_kernel and kernel_path == "sm90"), names


def _cta_rows(kernel_name: str) -> int:
    """Query rows per CTA of an sm_90a forward, from the kernel's FwdTraits<Element, head dim, rows>."""
    return int(re.search(r"FwdTraits<[^<>]*, (\d+), (\d+)>", kernel_name).group(2))


@pytest.mark.skipif(not is_hopper(), reason="needs a compute capability 9.0 GPU")
@pytest.mark.parametrize("mask_kind", ("token_rule", "causal", "block_mixture"))
@pytest.mark.parametrize("dim", (64, 96, 128, 256))
@pytest.mark.parametrize("extra_head", (0, 1))
def test_hopper_runs_64_row_ctas_while_every_cta_fits_at_once(kernel_path, dim, mask_kind, extra_head):
    """128-row mask blocks run as two 64-row CTAs while all of them fit on the GPU at once (two per
    multiprocessor at head dims 64 and 96, launched in the folded order; one at 128 and 256); one head more crosses to
    128-row CTAs (at 256: one item each, O staged in Q's buffer, 64-key tiles walking each mask block as two halves,
    pool rows staged from the half's columns). Two batch rows, so the launch order's ranks span batch and heads.
    Both match the reference."""
    if kernel_path != "sm90":
        pytest.skip("the CTA height is the sm_90a kernel's")
    batch, q_len = 2, 1000  # 16 tiles of 64 rows, 8 blocks of 128 per batch row and head
    ctas_at_once = torch.cuda.get_device_properties(0).multi_processor_count * (2 if dim <= 96 else 1)
    heads = ctas_at_once // (batch * 16) + extra_head
    dense = None
    if mask_kind == "token_rule":
        mask = OmniBlockMask.from_token_ids(*packed_vlm_ids(batch, q_len, seed=dim, device="cuda"))
    elif mask_kind == "causal":
        mask = OmniBlockMask.causal(q_len, q_len)
    else:
        dense = random_block_dense(batch, 1, q_len, q_len, 128, 128, seed=dim)
        mask = OmniBlockMask.from_dense(dense, block_size=128)
    q, k, v = _qkv(batch, heads, 1, q_len, q_len, dim, torch.float16, seed=heads)
    names = _forward_kernel_names(q, k, v, mask)
    assert len(names) == 1 and _cta_rows(names[0]) == (128 if extra_head else 64), names
    assert_matches_reference(q, k, v, mask, ref_mask=dense)


def _sm90_fwd_rows(batch, heads, q_len, *, implicit, softcap) -> int:
    """The CTA height host/tuning.cuh's sm90_fwd_block_m gives a head-dim-64 call with 128-row mask blocks."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def tiles(rows):
        return batch * heads * -(-q_len // rows)

    if tiles(64) <= 2 * sms:  # every 64-row CTA resident at once, two per SM
        return 64
    pads_little = 16 * -(-q_len // 192) * 192 <= 17 * -(-q_len // 128) * 128
    return 192 if tiles(192) >= 4 * sms and pads_little and implicit and softcap is None else 128


@pytest.mark.skipif(not is_hopper(), reason="needs a compute capability 9.0 GPU")
@pytest.mark.parametrize(
    "mask_kind,kv_extra,window,softcap,dtype",
    [("causal", 0, None, None, torch.bfloat16), ("causal", 700, None, None, torch.float16),
     ("causal", 0, 300, None, torch.float16), ("causal", 700, 300, None, torch.bfloat16),
     ("causal", 0, None, 20.0, torch.float16), ("full", 0, None, None, torch.bfloat16),
     ("full", 300, None, None, torch.float16), ("token_rule", 0, None, None, torch.bfloat16)])
@pytest.mark.parametrize("heads_less", (0, 4))
def test_hopper_runs_192_row_ctas_at_head_dim_64_under_implicit_masks(kernel_path, mask_kind, kv_extra, window,
                                                                     softcap, dtype, heads_less):
    """At head dim 64 an implicit mask (causal, windowed, full; no block rows to keep to) runs 192-row CTAs, three
    consumer warpgroups taking turns, where they make four waves; four heads fewer drop to 128 rows, as do softcap
    and a block-list mask at any size. 1500 query rows are seven tiles of 192 and one of 156 (tile and key
    boundaries fall off the mask's 128-row blocks); queries bottom-right aligned to longer keys, windows and GQA 4
    all cross them. Both match the reference."""
    if kernel_path != "sm90":
        pytest.skip("the CTA height is the sm_90a kernel's")
    batch, q_len = 2, 1500
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    heads = 4 * -(-4 * sms // (4 * batch * -(-q_len // 192))) - heads_less  # GQA 4: the fewest heads for 4 waves
    kv_len = q_len + kv_extra
    dense = None
    if mask_kind == "token_rule":
        mask = OmniBlockMask.from_token_ids(*packed_vlm_ids(batch, q_len, seed=heads, device="cuda"))
    elif mask_kind == "causal":
        mask = OmniBlockMask.causal(q_len, kv_len, window=window)
        dense = mask.to_dense("cuda")
    else:
        mask = OmniBlockMask.full(q_len, kv_len)
        dense = torch.ones(q_len, kv_len, dtype=torch.bool, device="cuda")
    q, k, v = _qkv(batch, heads, heads // 4, q_len, kv_len, 64, dtype, seed=heads + kv_len)
    names = _forward_kernel_names(q, k, v, mask, softcap)
    rows = _sm90_fwd_rows(batch, heads, q_len, implicit=mask_kind != "token_rule", softcap=softcap)
    assert rows == (192 if heads_less == 0 and mask_kind != "token_rule" and softcap is None else 128)
    assert len(names) == 1 and _cta_rows(names[0]) == rows, names
    assert_matches_reference(q, k, v, mask, softcap=softcap, ref_mask=dense,
                             lse_atol=LSE_ATOL if softcap is None else LSE_ATOL_SOFTCAP)


@pytest.mark.skipif(not is_hopper(), reason="needs a compute capability 9.0 GPU")
def test_hopper_keeps_128_row_ctas_where_192_rows_would_pad_the_queries(kernel_path):
    """CLIP-L's 577 patches per image (the implicit full mask, 64 images of 16 heads of 64): 192-row tiles would
    compute 768 rows against 640, so the forward keeps 128-row CTAs, and matches the reference."""
    if kernel_path != "sm90":
        pytest.skip("the CTA height is the sm_90a kernel's")
    mask = OmniBlockMask.full(577, 577)
    q, k, v = _qkv(64, 16, 16, 577, 577, 64, torch.bfloat16, seed=577)
    names = _forward_kernel_names(q, k, v, mask)
    assert _sm90_fwd_rows(64, 16, 577, implicit=True, softcap=None) == 128
    assert len(names) == 1 and _cta_rows(names[0]) == 128, names
    assert_matches_reference(q, k, v, mask, ref_mask=torch.ones(577, 577, dtype=torch.bool, device="cuda"))
