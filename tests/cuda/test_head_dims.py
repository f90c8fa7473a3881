"""Every head dim up to 512 that is a multiple of 8 runs a CUDA kernel: the instantiated ones directly, the others on
the next larger instantiation, whose loads read the columns past the true D as zeros and whose stores skip them
(exact: zero columns add nothing to q.k and give zero output columns; the scale stays the caller's, 1/sqrt(true D) by
default; no copy of q, k, v).

CPU: the table of which kernel takes each head dim, and the exactness of zero columns through the reference.
GPU (skipped without CUDA and the library): forward and every gradient of the public op at instantiated and
in-between head dims against the float64 definition (tests/helpers/brute_force.py), within the same derived bound as the
kernel tests (4x the same-dtype reference's error), over poisoned outputs, on both Hopper kernel paths; and no fp16 /
bf16 call with a head dim the kernels take ever reaches the reference.
"""

from __future__ import annotations

import pytest
import torch

from omni_hf import OmniBlockMask, omni_attention
from omni_hf.ops import library, reference
from tests.helpers.brute_force import causal_dense, naive_attention, packed_vlm_ids, token_rule_dense

pytestmark = pytest.mark.usefixtures("kernel_path")  # both Hopper kernel paths

ROUNDINGS_BOUND = 4.0  # kernel error / same-dtype reference error, as in test_cuda_backward.py
ALL_HEAD_DIMS = tuple(range(8, 513, 8))


# ---------------------------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("dim", ALL_HEAD_DIMS)
def test_each_head_dim_runs_on_the_smallest_instantiation_that_holds_it(dim):
    expected = min((d for d in library.HEAD_DIMS if d >= dim), default=None)
    assert library.kernel_head_dim(dim) == expected
    if dim in library.HEAD_DIMS:
        assert library.kernel_head_dim(dim) == dim


@pytest.mark.parametrize("dim, wide", [(72, 96), (80, 96), (112, 128), (200, 256), (264, 512)])
def test_zero_columns_leave_attention_exact_with_the_callers_scale(dim, wide):
    gen = torch.Generator().manual_seed(dim)
    q = torch.randn(2, 4, 70, dim, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 90, dim, generator=gen, dtype=torch.float64) for _ in range(2))
    doc, grp = packed_vlm_ids(2, 90, seed=dim, doc_range=(20, 60), text_range=(1, 10), image_range=(5, 20))
    mask = OmniBlockMask.from_token_ids(doc, grp, q_len=70)
    scale = dim ** -0.5
    out, lse = reference.attention_forward(q, k, v, mask, scale, None)
    padded = [torch.nn.functional.pad(t, (0, wide - dim)) for t in (q, k, v)]  # what the kernels' loads read
    out_wide, lse_wide = reference.attention_forward(*padded, mask, scale, None)
    torch.testing.assert_close(out_wide[..., :dim], out, rtol=1e-12, atol=1e-12)
    assert (out_wide[..., dim:] == 0).all()
    torch.testing.assert_close(lse_wide, lse, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- GPU


def _rel(x: torch.Tensor, gold: torch.Tensor) -> float:
    return float((x.double() - gold).norm() / gold.norm().clamp_min(1e-300))


def _block_mixture(length: int, block: int, gen: torch.Generator) -> torch.Tensor:
    """bool [1, 1, length, length] drawn block by block: all, none, causal or a random pattern, so that the mask
    built from it has every block type (FULL, MASKED, CAUSAL, PARTIAL from the pattern pool)."""
    causal = torch.arange(length)[:, None] >= torch.arange(length)[None, :]
    n = -(-length // block)
    kind = torch.randint(0, 4, (n, n), generator=gen).repeat_interleave(block, 0).repeat_interleave(block, 1)
    kind = kind[:length, :length]
    noise = torch.rand(length, length, generator=gen) < 0.5
    dense = torch.where(kind == 0, True, torch.where(kind == 1, False, torch.where(kind == 2, causal, noise)))
    return dense[None, None]


def _case(kind, batch, heads_q, heads_kv, length, dim, dtype, seed):
    """Transformers-layout q, k, v (transposed [B, S, H, D]) with gradients, dout, a mask of `kind` and its dense
    definition: "vlm" (the token rule over a packed interleaved row), "causal" (implicit) or "blocks64" /
    "blocks128" (every block type in blocks of that size)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(heads):
        x = torch.randn(batch, length, heads, dim, generator=gen, device="cuda").to(dtype).transpose(1, 2)
        return x.requires_grad_()

    q, k, v = rand(heads_q), rand(heads_kv), rand(heads_kv)
    dout = torch.randn(batch, heads_q, length, dim, generator=gen, device="cuda").to(dtype)
    if kind == "vlm":
        doc, grp = packed_vlm_ids(batch, length, seed=seed, doc_range=(60, 900), text_range=(1, 70),
                                  image_range=(20, 300))
        mask = OmniBlockMask.from_token_ids(doc.cuda(), grp.cuda())
        return q, k, v, dout, mask, token_rule_dense(doc, grp, length).cuda()
    if kind == "causal":
        return q, k, v, dout, OmniBlockMask.causal(length, length), causal_dense(length, length).cuda()
    block = int(kind.removeprefix("blocks"))
    dense = _block_mixture(length, block, torch.Generator().manual_seed(seed))
    return q, k, v, dout, OmniBlockMask.from_dense(dense, block_size=block).to("cuda"), dense.cuda()


def _run(q, k, v, dout, mask):
    for t in (q, k, v):
        t.grad = None
    out = omni_attention(q, k, v, mask)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.gpu
@pytest.mark.parametrize("dim", (32, 72, 80, 96, 112, 64, 128, 200, 256, 264, 392, 512))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=("bf16", "fp16"))
@pytest.mark.parametrize("kind", ("vlm", "causal", "blocks64", "blocks128"))
def test_every_head_dim_matches_the_definition_forward_and_backward(kind, dim, dtype, monkeypatch):
    monkeypatch.setenv("OMNI_HF_BACKEND", "cuda")  # a fallback to the reference would raise
    library.set_poison_outputs(True)
    try:
        q, k, v, dout, mask, allowed = _case(kind, 2, 4, 2, 777, dim, dtype, seed=dim)
        got = _run(q, k, v, dout, mask)
    finally:
        library.set_poison_outputs(False)
    up = [t.detach().double().requires_grad_() for t in (q, k, v)]
    gold_out, _ = naive_attention(*up, allowed, dim ** -0.5)
    gold = (gold_out.detach(), *torch.autograd.grad(gold_out, up, dout.double()))
    with monkeypatch.context() as m:
        m.setenv("OMNI_HF_BACKEND", "reference")
        same_dtype = _run(q, k, v, dout, mask)
    for name, g, exact, lo in zip(("out", "dq", "dk", "dv"), got, gold, same_dtype):
        assert g.shape == exact.shape and torch.isfinite(g).all(), name
        err, bound = _rel(g, exact), ROUNDINGS_BOUND * _rel(lo, exact)
        print(f"D={dim} {name}: relative error {err:.2e}, same-dtype reference {bound / ROUNDINGS_BOUND:.2e}")
        assert err <= bound, f"D={dim} {name}: relative error {err:.2e} > {bound:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dim", (200, 256, 512))
@pytest.mark.parametrize("q_len, kv_len, kind", [(1, 1000, "causal"), (3, 1031, "causal"), (2, 129, "full")])
def test_decoding_sized_calls_above_the_decode_kernels_head_dims_match_the_definition(q_len, kv_len, kind, dim,
                                                                                      monkeypatch):
    """The split-KV decode kernel is built up to head dim 128; a decoding step at 256 (Gemma 2 / 3), 512 (Gemma 4's
    global layers) or 200 runs the forward kernel, over poisoned outputs, with the bound of the test above."""
    monkeypatch.setenv("OMNI_HF_BACKEND", "cuda")
    gen = torch.Generator(device="cuda").manual_seed(q_len * 7 + kv_len)
    q = torch.randn(2, 8, q_len, dim, generator=gen, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(2, 4, kv_len, dim, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    mask = OmniBlockMask.causal(q_len, kv_len) if kind == "causal" else OmniBlockMask.full(q_len, kv_len)
    allowed = causal_dense(q_len, kv_len).cuda() if kind == "causal" else torch.ones(q_len, kv_len, dtype=torch.bool,
                                                                                       device="cuda")
    library.set_poison_outputs(True)
    try:
        out = omni_attention(q, k, v, mask)
    finally:
        library.set_poison_outputs(False)
    gold, _ = naive_attention(q.double(), k.double(), v.double(), allowed, dim ** -0.5)
    monkeypatch.setenv("OMNI_HF_BACKEND", "reference")
    same_dtype = omni_attention(q, k, v, mask)
    err, bound = _rel(out, gold), ROUNDINGS_BOUND * _rel(same_dtype, gold)
    print(f"D={dim} q_len={q_len}: relative error {err:.2e}, same-dtype reference {bound / ROUNDINGS_BOUND:.2e}")
    assert torch.isfinite(out).all() and err <= bound, f"relative error {err:.2e} > {bound:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=("bf16", "fp16"))
def test_no_half_precision_call_the_kernels_can_take_reaches_the_reference(dtype, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the reference ran")

    monkeypatch.setattr(reference, "attention_forward", refuse)
    monkeypatch.setattr(reference, "attention_backward", refuse)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for dim in (d for d in ALL_HEAD_DIMS if d <= library.HEAD_DIMS[-1]):
        q = torch.randn(1, 2, 200, dim, generator=gen, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(1, 1, 200, dim, generator=gen, device="cuda", dtype=dtype, requires_grad=True)
                for _ in range(2))
        for mask in (OmniBlockMask.causal(200, 200), OmniBlockMask.full(200, 200)):
            out = omni_attention(q, k, v, mask)
            out.float().square().sum().backward()
            assert out.shape[-1] == dim and torch.isfinite(out).all()
