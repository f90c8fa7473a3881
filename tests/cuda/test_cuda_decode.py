"""GPU tests of the decode path (csrc/decode/decode.cu): calls with at most 16 query rows per KV head
(q_len * Hq / Hkv) under an implicit mask run a split-KV kernel, one CTA per slice of the keys for all the query
heads of a KV head, and a merge kernel when the keys are split. Every case runs against the exact reference with
the outputs poisoned first, checks which kernels ran, and crosses the kernel's boundaries: its 64-key tiles and
each warp's 16 keys of a tile (lengths around their multiples), slices of more tiles than its 3-stage ring
holds, and batch x KV heads small enough to split, large enough not to."""

from __future__ import annotations

import pytest
import torch

from omni_hf import OmniBlockMask, omni_attention
from omni_hf.ops import reference
from tests.helpers.brute_force import relative_error
from tests.helpers.gpu_paths import kernel_names
from tests.helpers.kernel_checks import LSE_ATOL_SOFTCAP, _qkv, assert_matches_reference

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_outputs")]

TILE_KEYS = 64  # keys per tile of the slice kernel (16 per warp)


def _run_and_check(batch, heads_kv, group, q_len, kv_len, dim, dtype, mask, *, softcap=None, bshd=False, seed=0):
    q, k, v = _qkv(batch, heads_kv * group, heads_kv, q_len, kv_len, dim, dtype, seed, bshd=bshd)
    ran = kernel_names(lambda: assert_matches_reference(
        q, k, v, mask, softcap=softcap, lse_atol=LSE_ATOL_SOFTCAP if softcap else 2e-3), "omni")
    return ran


CASES = [  # (q_len, group, kv_len, mask kind, window)
    (1, 1, 1, "causal", None),
    (1, 4, 127, "causal", None),
    (1, 4, 129, "causal", None),
    (1, 8, 1000, "causal", None),
    (1, 16, 2049, "causal", None),
    (2, 8, 385, "causal", None),
    (3, 5, 700, "causal", None),
    (5, 3, 256, "causal", None),
    (16, 1, 300, "causal", None),
    (4, 2, 1031, "causal", 1),
    (3, 4, 1031, "causal", 50),
    (1, 4, 5000, "causal", 300),
    (2, 4, 517, "full", None),
    (1, 2, 64, "full", None),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim", [40, 64, 80, 96, 112, 128])  # 40 / 80 / 112: the next kernel's, at their true width
@pytest.mark.parametrize("q_len,group,kv_len,kind,window", CASES)
def test_decode_path_matches_reference(q_len, group, kv_len, kind, window, dim, dtype):
    mask = OmniBlockMask.full(q_len, kv_len) if kind == "full" else OmniBlockMask.causal(q_len, kv_len, window=window)
    ran = _run_and_check(2, 2, group, q_len, kv_len, dim, dtype, mask, seed=q_len * 1000 + kv_len)
    assert any("slice_kernel" in name for name in ran), f"the decode path did not run: {ran}"


@pytest.mark.parametrize("softcap", [None, 20.0])
def test_decode_path_takes_transposed_inputs_and_softcap(softcap):
    ran = _run_and_check(3, 2, 4, 2, 900, 128, torch.bfloat16, OmniBlockMask.causal(2, 900), softcap=softcap,
                         bshd=True)
    assert any("slice_kernel" in name for name in ran)


def test_long_keys_split_into_slices_of_several_tiles_and_merge():
    # One (batch, KV head): the keys of 40k tokens are cut into slices of more than one 64-key tile.
    ran = _run_and_check(1, 1, 4, 1, 40_000 + 77, 128, torch.bfloat16, OmniBlockMask.causal(1, 40_077))
    assert any("merge_kernel" in name for name in ran), ran


@pytest.mark.parametrize("dim", [64, 96, 128])
def test_slices_longer_than_the_ring_wrap_it(dim):
    # 8 x 8 (batch, KV head) pairs leave room for a few slices each: every slice walks about a dozen tiles, so
    # the 3-stage ring of K / V tiles is reused several times; the length ends inside a warp's 16 keys.
    kv_len = 50 * TILE_KEYS + 21
    ran = _run_and_check(8, 8, 4, 1, kv_len, dim, torch.bfloat16, OmniBlockMask.causal(1, kv_len), seed=dim)
    assert any("slice_kernel" in name for name in ran), ran


def test_many_kv_heads_run_unsplit_without_merge():
    # 64 x 8 CTAs are more than half of one wave on an A100 or H100 (4 CTAs on each of 108 / 132
    # multiprocessors): one slice each, written straight to the output.
    ran = _run_and_check(64, 8, 4, 1, 6 * TILE_KEYS + 5, 64, torch.float16, OmniBlockMask.causal(1, 6 * TILE_KEYS + 5))
    assert any("slice_kernel" in name for name in ran) and not any("merge_kernel" in name for name in ran), ran


def test_rows_before_the_first_key_output_zero():
    # q_len > kv_len under bottom-right alignment: the first q_len - kv_len rows see no key.
    ran = _run_and_check(2, 2, 4, 4, 2, 64, torch.bfloat16, OmniBlockMask.causal(4, 2))
    assert any("slice_kernel" in name for name in ran)


def test_more_than_16_rows_per_kv_head_take_the_main_kernels():
    ran = _run_and_check(1, 2, 8, 3, 500, 64, torch.bfloat16, OmniBlockMask.causal(3, 500))
    assert not any("slice_kernel" in name for name in ran), ran


def test_decode_forward_feeds_the_backward():
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(2, 8, 1, 128, device="cuda", generator=gen)
    k, v = (torch.randn(2, 2, 1500, 128, device="cuda", generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    mask = OmniBlockMask.causal(1, 1500)
    q16, k16, v16 = (t.to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    out = omni_attention(q16, k16, v16, mask)
    out.backward(dout.to(torch.bfloat16))
    q32, k32, v32 = (t.detach().float().cpu().requires_grad_() for t in (q16, k16, v16))
    ref = omni_attention(q32, k32, v32, mask)  # the reference on the CPU, float32, with its own backward
    ref.backward(dout.to(torch.bfloat16).float().cpu())
    assert relative_error(out.cpu(), ref) < 1e-2
    for got, want in ((q16.grad, q32.grad), (k16.grad, k32.grad), (v16.grad, v32.grad)):
        assert relative_error(got.cpu(), want) < 2e-2


def test_captured_decode_replays_on_new_inputs():
    q, k, v = _qkv(1, 16, 4, 1, 2048, 128, torch.bfloat16, seed=9)
    mask = OmniBlockMask.causal(1, 2048)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        omni_attention(q, k, v, mask)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = omni_attention(q, k, v, mask)
    for seed in (10, 11):
        fresh = _qkv(1, 16, 4, 1, 2048, 128, torch.bfloat16, seed=seed)
        for buffer, value in zip((q, k, v), fresh):
            buffer.copy_(value)
        out.fill_(float("nan"))
        graph.replay()
        want = reference.attention_forward(*(t.double() for t in fresh), mask, 128 ** -0.5, None)[0]
        assert relative_error(out, want) < 1e-2


if __name__ == "__main__":  # cases that cross every boundary of the slice kernel and the merge, for compute-sanitizer
    for dim in (64, 96, 128):
        for q_len, group, kv_len, heads_kv, batch in ((1, 4, 50 * TILE_KEYS + 21, 8, 8), (3, 5, 700, 2, 2),
                                                      (16, 1, 300, 2, 2), (1, 4, 40_077, 1, 1)):
            q, k, v = _qkv(batch, heads_kv * group, heads_kv, q_len, kv_len, dim, torch.bfloat16, dim, bshd=dim == 96)
            assert_matches_reference(q, k, v, OmniBlockMask.causal(q_len, kv_len, window=300 if q_len == 3 else None))
    print("ok")
