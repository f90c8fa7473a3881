"""omni_attention: the op against the float64 softmax, autograd, torch.compile, and input checks."""

import dataclasses

import pytest
import torch

from omni_hf import OmniBlockMask, omni_attention
from tests.helpers.brute_force import naive_attention, relative_error, token_rule_dense


def interleaved(batch=2, seq_len=200, seed=0):
    gen = torch.Generator().manual_seed(seed)
    doc = (torch.arange(seq_len) >= int(torch.randint(20, seq_len - 20, (), generator=gen))).int().repeat(batch, 1)
    grp = torch.full_like(doc, -1)
    grp[:, 30:90] = 0
    grp[:, seq_len - 50: seq_len - 10] = 1
    return OmniBlockMask.from_token_ids(doc, grp, block_size=64), token_rule_dense(doc, grp, seq_len)


def qkv(batch=2, heads_q=4, heads_kv=2, seq_len=200, dim=32, seed=1, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads_q, seq_len, dim), (batch, heads_kv, seq_len, dim), (batch, heads_kv, seq_len, dim)]
    return [torch.randn(s, generator=gen).requires_grad_(requires_grad) for s in shapes]


def test_op_forward_backward_match_float64_softmax_with_gqa_and_transposed_inputs():
    mask, dense = interleaved()
    # Transformers hands [B, S, H, D] tensors transposed to [B, H, S, D]: strided, last dim contiguous.
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in qkv())
    assert not q.is_contiguous()
    out, lse = omni_attention(q, k, v, mask, scale=0.2, softcap=8.0, return_lse=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    expected, expected_lse = naive_attention(q64, k64, v64, dense, 0.2, 8.0)
    expected.backward(dout.double())
    assert relative_error(out, expected) < 1e-6
    live = torch.isfinite(expected_lse)
    assert relative_error(lse[live], expected_lse[live]) < 1e-6
    for grad, ref in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        assert relative_error(grad, ref) < 1e-5


def test_head_dim_512_the_largest_runs_exactly():
    """Gemma 4's global head dim, on the reference: forward and the gradients of q, k and v against the float64
    softmax, over 130 keys (three 64-key tiles) of interleaved text and images."""
    mask, dense = interleaved(seq_len=130)
    q, k, v = qkv(seq_len=130, dim=512, requires_grad=True)
    out = omni_attention(q, k, v, mask)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    expected, _ = naive_attention(q64, k64, v64, dense, 512 ** -0.5)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), dout.double())
    for got, want in zip((out, *grads), (expected, *expected_grads), strict=True):
        assert relative_error(got, want) < 1e-5


def test_default_scale_is_inverse_sqrt_head_dim():
    mask, dense = interleaved(batch=1)
    q, k, v = qkv(batch=1)
    expected, _ = naive_attention(q, k, v, dense, 32 ** -0.5)
    assert relative_error(omni_attention(q, k, v, mask), expected) < 1e-6


def test_lse_is_not_differentiable():
    mask, _ = interleaved(batch=1)
    q, k, v = qkv(batch=1, requires_grad=True)
    _, lse = omni_attention(q, k, v, mask, return_lse=True)
    assert not lse.requires_grad


@pytest.mark.parametrize("kind", ["token_ids", "causal_transposed"])
def test_torch_compile_fullgraph_forward_backward_matches_eager(kind):
    """Token-rule masks carry id tensors, causal ones None in their place; Transformers hands transposed
    views, whose gradients must still come back in the layout the fake op promises."""
    if kind == "token_ids":
        mask, _ = interleaved()
        q, k, v = qkv(requires_grad=True)
    else:
        mask = OmniBlockMask.causal(200, block_size=64)
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in qkv())

    def loss(q, k, v, mask):
        return omni_attention(q, k, v, mask, softcap=10.0).square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    value = compiled(q, k, v, mask)
    grads = torch.autograd.grad(value, (q, k, v))
    eager_value = loss(q, k, v, mask)
    eager_grads = torch.autograd.grad(eager_value, (q, k, v))
    torch.testing.assert_close(value, eager_value)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


def test_backend_override_reference_and_bad_value(monkeypatch):
    mask, dense = interleaved(batch=1)
    q, k, v = qkv(batch=1)
    monkeypatch.setenv("OMNI_HF_BACKEND", "reference")
    expected, _ = naive_attention(q, k, v, dense, 32 ** -0.5)
    assert relative_error(omni_attention(q, k, v, mask), expected) < 1e-6
    monkeypatch.setenv("OMNI_HF_BACKEND", "triton")
    with pytest.raises(ValueError, match="OMNI_HF_BACKEND: expected"):
        omni_attention(q, k, v, mask)


def bad_inputs(device="cpu", dtype=torch.float32):
    """(name, call arguments, exception, message) for every check of omni_attention, its tensors on ``device`` in
    ``dtype`` (on a GPU the CUDA op refuses most of them and omni_attention names the argument)."""
    mask, _ = interleaved(batch=2)
    mask = mask.to(device)
    q, k, v = (x.to(device, dtype) for x in qkv())
    cases = [
        ("q not a tensor", (q.tolist(), k, v, mask), {}, TypeError, "q: expected a torch.Tensor"),
        ("3-dim q", (q[0], k, v, mask), {}, ValueError, "q: expected 4 dims"),
        ("int dtype", (q.long(), k.long(), v.long(), mask), {}, TypeError, "q: expected dtype in"),
        ("mixed dtypes", (q, k.double(), v, mask), {}, TypeError, "k: expected dtype"),
        ("last dim strided", (q, k.transpose(2, 3).contiguous().transpose(2, 3), v, mask), {}, ValueError,
         "k: expected the last dim contiguous"),
        ("k/v shapes differ", (q, k, v[:, :1], mask), {}, ValueError, "v: expected the shape of k"),
        ("batch differs", (q, k[:1], v[:1], mask), {}, ValueError, "k: expected shape"),
        ("heads not dividing", (q, torch.cat([k, k[:, :1]], 1), torch.cat([v, v[:, :1]], 1), mask), {}, ValueError,
         "k: expected a head count dividing"),
        ("odd head dim", (q[..., :30], k[..., :30], v[..., :30], mask), {}, ValueError, "multiple of 8"),
        ("head dim above 512", [x.to(device, dtype) for x in qkv(dim=520)] + [mask], {}, ValueError,
         "q: expected a head dim that is a multiple of 8 and at most 512, got 520"),
        ("dense mask", (q, k, v, mask.to_dense()), {}, TypeError, "block_mask: expected an OmniBlockMask"),
        ("mask lengths", (q[:, :, :100], k, v, mask), {}, ValueError, "block_mask: expected q_len=100"),
        ("mask batch", (q[:1], k[:1], v[:1], mask), {}, ValueError,
         r"block_mask: expected batch 1 \(q's batch\), got 2"),
        ("mask heads", (q, k, v, OmniBlockMask.from_dense(torch.ones(1, 3, 200, 200, dtype=torch.bool)).to(device)),
         {}, ValueError, "block_mask: expected heads 1 or Hq=4"),
        ("doc ids batch", (q, k, v, dataclasses.replace(mask, token_rule=dataclasses.replace(
            mask.token_rule, doc_ids=torch.zeros(3, 200, dtype=torch.int32, device=device)))), {},
         ValueError, "block_mask.token_rule.doc_ids: expected batch"),
        ("scale", (q, k, v, mask), {"scale": float("nan")}, ValueError, "scale: expected a positive finite float"),
        ("softcap", (q, k, v, mask), {"softcap": -1.0}, ValueError, "softcap: expected a positive"),
    ]
    return [pytest.param(*case[1:], id=case[0]) for case in cases]


@pytest.mark.parametrize("args, kwargs, error, message", bad_inputs())
def test_bad_input_names_the_argument(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        omni_attention(*args, **kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("args, kwargs, error, message",
                         bad_inputs("cuda", torch.bfloat16) if torch.cuda.is_available() else [])
def test_bad_input_on_the_gpu_names_the_argument(args, kwargs, error, message, monkeypatch):
    """The CUDA op checks the tensors itself (csrc/host/torch_ops.cpp); what it refuses, omni_attention names."""
    monkeypatch.setenv("OMNI_HF_BACKEND", "auto")
    with pytest.raises(error, match=message):
        omni_attention(*args, **kwargs)


def test_autocast_runs_in_the_autocast_dtype_like_sdpa():
    """Under bf16 autocast, RoPE hands float32 q / k; the op must run in bf16 (the kernels' dtype)."""
    mask, dense = interleaved(batch=1)
    q, k, v = qkv(batch=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = omni_attention(q, k, v, mask)
    assert out.dtype == torch.bfloat16
    expected, _ = naive_attention(*(x.bfloat16().double() for x in (q, k, v)), dense, 32 ** -0.5)
    assert relative_error(out, expected) < 1e-2  # bf16 rounding of the output only


def test_inputs_in_transformers_bshd_layout_get_a_transpose_hint():
    """q, k, v as [B, S, H, D] (Transformers' layout before its transpose) name the layout, not the mask."""
    mask, _ = interleaved()
    q, k, v = (x.transpose(1, 2).contiguous() for x in qkv())
    with pytest.raises(ValueError, match=r"q: expected \[B, H, S, D\], got shape \(2, 200, 4, 32\), which looks like "
                                         r"\[B, S, H, D\] .*pass q.transpose\(1, 2\), and k and v likewise"):
        omni_attention(q, k, v, mask)
    omni_attention(*(x.transpose(1, 2) for x in (q, k, v)), mask)  # the hint's fix runs
