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


@pytest.fixture
def restore_determinism():
    state = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(state[0], warn_only=state[1])


def _cuda_backward_on_a_stub(monkeypatch, *, sinks=None, bias=None, deterministic=False):
    """`attention._backward` of the CUDA backend with the library's op replaced by a stub that records what it was
    given and writes random values into dbias and dsinks (the kernels' part); returns (results, what the stub got)."""
    from omni_hf.ops import attention, library

    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 2, 5, 8, generator=gen) for _ in range(3))
    got = {}

    def stub(dout, q, k, v, out, lse, mask_tensors, mask_sizes, scale, softcap, bias, dbias, sinks, dsinks,
             deterministic):
        got.update(dbias=dbias, sinks=sinks, dsinks=dsinks, deterministic=deterministic)
        for t in (dbias, dsinks):
            if t is not None:
                t.copy_(torch.randn(t.shape, generator=gen))
        return torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)

    monkeypatch.setattr(library, "backward", stub)
    dout, out, lse = torch.randn(2, 2, 5, 8, generator=gen), torch.randn(2, 2, 5, 8, generator=gen), torch.randn(
        2, 2, 5, generator=gen)
    results = attention._backward("cuda", dout, q, k, v, out, lse, sinks, sinks is not None, bias, bias is not None,
                                  [], [5, 5, 64, 64, None, False, 2], 0.3, 0.0, deterministic)
    return results, got, (dout, out, lse)


@pytest.mark.parametrize("how", ["argument", "torch_mode"])
def test_a_deterministic_cuda_backward_sums_what_the_kernels_would_add_with_atomics(monkeypatch, restore_determinism,
                                                                                     how):
    """``deterministic=True`` or ``torch.use_deterministic_algorithms(True)``: the op is asked for its ordered dQ,
    gets no sinks (their gradient comes from `reference.sink_gradient`) and, for a bias broadcast over the batch, a
    float32 buffer of the call's shape, which is then summed over the batch into the bias's shape."""
    from omni_hf.ops import reference

    torch.use_deterministic_algorithms(how == "torch_mode")
    sinks, bias = torch.randn(2), torch.randn(1, 2, 5, 5, dtype=torch.bfloat16)
    (dq, _, _, dsinks, dbias), got, (dout, out, lse) = _cuda_backward_on_a_stub(
        monkeypatch, sinks=sinks, bias=bias, deterministic=how == "argument")
    assert got["deterministic"] is True and got["sinks"] is None and got["dsinks"] is None
    assert got["dbias"].shape == (2, 2, 5, 5) and got["dbias"].dtype == torch.float32
    assert dbias.shape == bias.shape and torch.equal(dbias, got["dbias"].sum(0, keepdim=True))
    assert torch.equal(dsinks, reference.sink_gradient(dout, out, lse, sinks))
    assert dq.shape == (2, 2, 5, 8)


def test_the_default_cuda_backward_leaves_sinks_and_a_broadcast_bias_to_the_kernels(monkeypatch, restore_determinism):
    torch.use_deterministic_algorithms(False)
    sinks, bias = torch.randn(2), torch.randn(1, 2, 5, 5, dtype=torch.bfloat16)
    (_, _, _, dsinks, dbias), got, _ = _cuda_backward_on_a_stub(monkeypatch, sinks=sinks, bias=bias)
    assert got["deterministic"] is False
    assert got["sinks"] is not None and torch.equal(got["sinks"], sinks.float())
    assert dsinks is got["dsinks"] and dbias is got["dbias"]
    assert dbias.shape == bias.shape and dbias.dtype == torch.float32  # atomics add into float32


def test_the_reference_backward_runs_in_deterministic_mode_and_repeats_bitwise(restore_determinism):
    torch.use_deterministic_algorithms(True)
    doc, grp = torch.tensor([[0] * 40 + [1] * 30]), torch.tensor([[-1] * 10 + [0] * 12 + [-1] * 48])
    mask = OmniBlockMask.from_token_ids(doc, grp, block_size=64)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 70, 16, generator=gen) for _ in range(3))
    grads = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        omni_attention(*leaves, mask).square().sum().backward()
        grads.append([t.grad for t in leaves])
    for first, second in zip(*grads):
        assert torch.equal(first, second)
