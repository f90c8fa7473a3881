"""Learnable sinks (``omni_attention(..., sinks=)``) against a float64 definition, on the reference and the kernels.

The definition appends each head's sink logit as one more column of every row's scores, takes the softmax over
the row and drops that column: nothing of the implementation's max-merge is shared. Forward (out, lse) and every
gradient (dq, dk, dv, dsinks) are compared on fresh random inputs, with every mask kind, GQA, B = 2, softcap,
windows, rows with no allowed key (out 0, lse = the sink) and lengths that cross the 64 / 128 tiles. On a GPU the
kernels run in bf16 and must stay within a few roundings of the same-dtype reference (`ROUNDINGS_BOUND`); on a
Hopper GPU every GPU case runs on both kernel families (``kernel_path``); GPU cases skip without the library.
"""

from __future__ import annotations

import pytest
import torch

from omni_hf import OmniBlockMask, omni_attention
from omni_hf.ops import library
from tests.helpers.brute_force import masks_of_every_kind, relative_error

ROUNDINGS_BOUND = 4.0  # kernel error / same-dtype reference error, as in the backward's tests


def sink_definition(q, k, v, allowed, scale, sinks, softcap=None):
    """float64 attention with a sink column: out [B, Hq, Sq, D], lse [B, Hq, Sq] (autograd through everything)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = torch.where(allowed.expand_as(s), s, float("-inf"))
    sink_column = sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)
    p = torch.softmax(torch.cat([s, sink_column], -1), -1)[..., :-1]
    lse = torch.logsumexp(torch.cat([s, sink_column], -1), -1)
    return torch.einsum("bhqk,bhkd->bhqd", p, v), lse


def _inputs(batch, heads_q, heads_kv, q_len, kv_len, dim, dtype, device, gen):
    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    q, k, v = rand(batch, heads_q, q_len, dim), rand(batch, heads_kv, kv_len, dim), rand(batch, heads_kv, kv_len, dim)
    sinks = (torch.randn(heads_q, generator=gen) * 2).to(device)  # logits of the scores' size, some dominant
    return q, k, v, rand(batch, heads_q, q_len, dim), sinks


def _run(q, k, v, dout, sinks, mask, softcap):
    """out, lse and (dq, dk, dv, dsinks) of omni_attention on leaf copies of the inputs."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = omni_attention(*leaves[:3], mask, softcap=softcap, sinks=leaves[3], return_lse=True)
    out.backward(dout)
    return out, lse, [t.grad for t in leaves]


def _gold(q, k, v, dout, sinks, mask, softcap):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = sink_definition(*leaves[:3], mask.to_dense().to(q.device), q.shape[-1] ** -0.5, leaves[3], softcap)
    out.backward(dout.double())
    return out, lse, [t.grad for t in leaves]


@pytest.mark.parametrize("softcap", [None, 20.0])
def test_sinks_on_the_reference_match_the_definition(softcap):
    gen = torch.Generator().manual_seed(7)
    q_len, kv_len = 150, 260
    inputs = _inputs(2, 4, 2, q_len, kv_len, 32, torch.float32, "cpu", gen)
    for name, mask in masks_of_every_kind(2, 4, q_len, kv_len, "cpu", gen):
        out, lse, grads = _run(*inputs, mask, softcap)
        gold_out, gold_lse, gold_grads = _gold(*inputs, mask, softcap)
        assert relative_error(out, gold_out) < 1e-5, name
        torch.testing.assert_close(lse.double(), gold_lse, rtol=1e-5, atol=1e-5, msg=name)
        for grad, gold, what in zip(grads, gold_grads, ("dq", "dk", "dv", "dsinks")):
            assert relative_error(grad, gold) < 1e-5, (name, what)


def test_a_row_with_no_allowed_key_outputs_zero_with_the_sink_as_its_lse():
    gen = torch.Generator().manual_seed(3)
    q, k, v, dout, sinks = _inputs(2, 4, 2, 40, 40, 16, torch.float32, "cpu", gen)
    doc = torch.zeros(2, 40, dtype=torch.int32)
    doc[1, :10] = -1  # padding: rows 0..9 of batch row 1 see nothing
    mask = OmniBlockMask.from_token_ids(doc, torch.full_like(doc, -1))
    out, lse, (dq, _, _, dsinks) = _run(q, k, v, dout, sinks, mask, None)
    assert torch.equal(out[1, :, :10], torch.zeros_like(out[1, :, :10]))
    assert torch.equal(lse[1, :, :10], sinks[:, None].expand(4, 10))
    assert torch.equal(dq[1, :, :10], torch.zeros_like(dq[1, :, :10]))
    assert torch.isfinite(dsinks).all() and dsinks.abs().sum() > 0


def test_sinks_are_checked_by_name():
    q, k, v = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    mask = OmniBlockMask.causal(8, 8)
    with pytest.raises(ValueError, match=r"sinks: expected shape \[Hq\] = \[4\]"):
        omni_attention(q, k, v, mask, sinks=torch.zeros(2))
    with pytest.raises(TypeError, match="sinks: expected dtype"):
        omni_attention(q, k, v, mask, sinks=torch.zeros(4, dtype=torch.int64))
    with pytest.raises(TypeError, match="sinks: expected a torch.Tensor"):
        omni_attention(q, k, v, mask, sinks=[0.0] * 4)


def _kernel_errors_within_bound(inputs_cuda, mask, softcap, name):
    """The kernel's errors against float64 stay within ROUNDINGS_BOUND of the bf16 reference's own; dsinks, a sum
    over every row of a head in which the terms cancel, within what the kernel's own out and lse errors allow
    (`_dsinks_error_bound`)."""
    out, lse, grads = _run(*inputs_cuda, mask, softcap)
    gold_out, gold_lse, gold_grads = _gold(*inputs_cuda, mask, softcap)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNI_HF_BACKEND", "reference")
        ref_out, ref_lse, ref_grads = _run(*inputs_cuda, mask, softcap)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), name
    floor = 1e-3  # bf16's half-ulp: where the reference rounds exactly, the kernel may still round once
    assert relative_error(out, gold_out) <= ROUNDINGS_BOUND * relative_error(ref_out, gold_out) + floor, name
    assert (lse.double() - gold_lse).abs().max() < 1e-3 + (ref_lse.double() - gold_lse).abs().max(), name
    for grad, ref, gold, what in zip(grads[:3], ref_grads, gold_grads, ("dq", "dk", "dv")):
        assert torch.isfinite(grad).all(), (name, what)
        assert relative_error(grad, gold) <= ROUNDINGS_BOUND * relative_error(ref, gold) + floor, (name, what)
    dout, sinks = inputs_cuda[3], inputs_cuda[4]
    error = (grads[3].double() - gold_grads[3]).abs()
    assert (error <= _dsinks_error_bound(dout, sinks, out, lse, gold_out, gold_lse)).all(), (name, error)


def _dsinks_error_bound(dout, sinks, out, lse, gold_out, gold_lse) -> torch.Tensor:
    """[Hq] float64: how far ``dsinks = -sum_rows w * D`` (``w = exp(sink - lse)``, ``D = rowsum(dout * out)``) may
    lie from the definition's when computed from the kernel's out and lse: by the triangle inequality at most
    ``sum_rows w_gold * |D - D_gold| + |w - w_gold| * |D|``, with ``|D - D_gold| <= rowsum(|dout| * |out -
    out_gold|)``; plus float32 rounding (2^-20 of ``sum_rows w * rowsum(|dout * out|)``)."""
    dout, out, lse = dout.double(), out.double(), lse.double()
    w_gold = torch.exp(sinks.double()[None, :, None] - gold_lse.detach())
    w = torch.exp(sinks.double()[None, :, None] - lse)
    d = (dout * out).sum(-1)
    d_error = (dout.abs() * (out - gold_out.detach()).abs()).sum(-1)
    terms = w_gold * d_error + (w - w_gold).abs() * d.abs()
    return (terms + 2.0 ** -20 * w * (dout * out).abs().sum(-1)).sum((0, 2))


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("dim", [64, 128, 256, 512])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_sinks_on_the_kernels_match_the_definition(dim, softcap):
    gen = torch.Generator().manual_seed(dim)
    q_len, kv_len = 700, 1000  # crosses 64- and 128-row tiles; the query rows are the last 700 positions
    inputs = _inputs(2, 8, 2, q_len, kv_len, dim, torch.bfloat16, "cuda", gen)
    library.set_poison_outputs(True)  # every output element must be written: NaN where the kernel leaves one
    try:
        for name, mask in masks_of_every_kind(2, 8, q_len, kv_len, "cuda", gen):
            _kernel_errors_within_bound(inputs, mask, softcap, name)
    finally:
        library.set_poison_outputs(False)


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path")
@pytest.mark.parametrize("q_len", [1, 2, 4])  # 4 query heads a KV head: up to 16 rows, the decode path
def test_sinks_on_the_decode_kernels_match_the_definition(q_len):
    gen = torch.Generator().manual_seed(q_len)
    kv_len = 5000  # long enough for the decode path to split the keys over several slices
    inputs = _inputs(2, 8, 2, q_len, kv_len, 128, torch.bfloat16, "cuda", gen)
    for mask in (OmniBlockMask.causal(q_len, kv_len), OmniBlockMask.causal(q_len, kv_len, window=300)):
        _kernel_errors_within_bound(inputs, mask, None, f"decode q_len={q_len}")
