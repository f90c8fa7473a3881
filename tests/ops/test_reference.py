"""The exact reference against a float64 naive softmax, forward and gradients."""

import subprocess
import sys
import textwrap

import pytest
import torch

from omni_hf import OmniBlockMask
from omni_hf.ops import reference
from omni_hf.ops.reference import attention_backward, attention_forward
from tests.helpers.brute_force import naive_attention, relative_error, token_rule_dense


def random_case(batch, heads_q, heads_kv, q_len, kv_len, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads_q, q_len, dim, generator=gen)
    k = torch.randn(batch, heads_kv, kv_len, dim, generator=gen)
    v = torch.randn(batch, heads_kv, kv_len, dim, generator=gen)
    return q, k, v


def interleaved_mask(batch, kv_len, q_len, seed):
    """Token-rule mask with two documents, an image each, and padding rows at the start of the queries."""
    gen = torch.Generator().manual_seed(seed)
    cut = int(torch.randint(1, kv_len, (), generator=gen))
    doc = torch.where(torch.arange(kv_len) < cut, 0, 1).int().repeat(batch, 1)
    doc[:, kv_len - q_len: kv_len - q_len + 3] = -1  # padding queries: fully masked rows
    grp = torch.full_like(doc, -1)
    grp[:, cut // 3: cut // 3 + cut // 2] = 0
    grp[:, cut + 1: cut + 1 + (kv_len - cut) // 2] = 1
    return OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, block_size=64), token_rule_dense(doc, grp, q_len)


@pytest.mark.parametrize("heads_q, heads_kv", [(4, 4), (4, 1), (8, 2)])
@pytest.mark.parametrize("q_len, kv_len", [(77, 77), (50, 190), (1, 130)])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_forward_and_gradients_match_float64_softmax(heads_q, heads_kv, q_len, kv_len, softcap):
    q, k, v = random_case(2, heads_q, heads_kv, q_len, kv_len, 32, seed=q_len * heads_q + kv_len)
    mask, dense = interleaved_mask(2, kv_len, q_len, seed=kv_len)
    scale = 0.3
    out, lse = attention_forward(q, k, v, mask, scale, softcap)

    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    expected, expected_lse = naive_attention(q64, k64, v64, dense, scale, softcap)
    assert relative_error(out, expected) < 1e-6
    live = torch.isfinite(expected_lse)
    assert torch.equal(torch.isfinite(lse), live)
    assert relative_error(lse[live], expected_lse[live]) < 1e-6

    dout = torch.randn_like(out)
    expected.backward(dout.double())
    grads = attention_backward(dout, q, k, v, out, lse, mask, scale, softcap)
    for grad, tensor in zip(grads, (q64, k64, v64)):
        assert relative_error(grad, tensor.grad) < 1e-5


def test_fully_masked_rows_output_zero_lse_minus_inf_and_zero_grad():
    q, k, v = random_case(1, 2, 2, 40, 40, 16, seed=3)
    dense = torch.ones(40, 40, dtype=torch.bool).tril()
    dense[5:9] = False
    out, lse = attention_forward(q, k, v, dense)
    assert torch.equal(out[:, :, 5:9], torch.zeros_like(out[:, :, 5:9]))
    assert torch.isneginf(lse[:, :, 5:9]).all() and torch.isfinite(lse[:, :, :5]).all()
    dq, dk, dv = attention_backward(torch.randn_like(out), q, k, v, out, lse, dense)
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
    assert torch.equal(dq[:, :, 5:9], torch.zeros_like(dq[:, :, 5:9]))


def test_block_mask_and_its_dense_mask_give_the_same_result():
    q, k, v = random_case(2, 4, 2, 150, 150, 16, seed=5)
    mask, dense = interleaved_mask(2, 150, 150, seed=6)
    a, lse_a = attention_forward(q, k, v, mask)
    b, lse_b = attention_forward(q, k, v, dense)
    assert torch.equal(a, b) and torch.equal(lse_a, lse_b)


def test_chunking_over_query_rows_keeps_the_result_exact(monkeypatch):
    """7-row chunks give the float64 result as closely as one chunk does (summation order may differ)."""
    monkeypatch.setattr(reference, "_CHUNK_ELEMENTS", 2 * 300 * 7)
    q, k, v = random_case(1, 2, 1, 300, 300, 16, seed=7)
    mask, dense = interleaved_mask(1, 300, 300, seed=8)
    out, lse = attention_forward(q, k, v, mask)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    expected, _ = naive_attention(q64, k64, v64, dense, 16 ** -0.5)
    dout = torch.randn_like(out)
    expected.backward(dout.double())
    assert relative_error(out, expected) < 1e-6
    for grad, tensor in zip(attention_backward(dout, q, k, v, out, lse, mask), (q64, k64, v64)):
        assert relative_error(grad, tensor.grad) < 1e-5


def test_low_precision_inputs_keep_their_dtype_and_accumulate_in_float32():
    q, k, v = random_case(1, 2, 2, 64, 64, 32, seed=9)
    dense = torch.ones(64, 64, dtype=torch.bool).tril()
    out, lse = attention_forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), dense)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    expected, _ = naive_attention(q.bfloat16().double(), k.bfloat16().double(), v.bfloat16().double(), dense,
                                  32 ** -0.5)
    assert relative_error(out, expected) < 1e-2  # only the bf16 rounding of the output


def test_sixteen_k_tokens_run_without_an_s_by_s_buffer():
    """S = 16k needs 1 GiB per head for whole fp32 scores; the chunked reference adds far less to the
    process's peak memory (measured inside a fresh process, after its imports)."""
    script = textwrap.dedent("""
        import resource
        import torch
        from omni_hf import OmniBlockMask
        from omni_hf.ops.reference import attention_forward
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 1, 16384, 16) for _ in range(3))
        mask = OmniBlockMask.causal(16384)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out, lse = attention_forward(q, k, v, mask)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    """)
    result = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    added_peak_bytes = int(result.stdout.split()[-1])
    assert added_peak_bytes < 2**29
