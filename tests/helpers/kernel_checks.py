"""The forward kernel's checks against the reference and the random CUDA inputs they run on, shared by the forward
and decoding tests and the compute-sanitizer script."""

from __future__ import annotations

import math

import torch

from omni_hf.ops import library, reference

OUT_TOL = {torch.float16: 5e-3, torch.bfloat16: 1e-2}  # ||out - ref|| / ||ref||
LSE_ATOL = 2e-3
# tanh.approx.f32 has a relative error of 2^-11, so a capped score s carries up to |s| * 5e-4 of error.
LSE_ATOL_SOFTCAP = 1e-2


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _qkv(batch, heads_q, heads_kv, q_len, kv_len, dim, dtype, seed, bshd=False):
    """Random q [B, Hq, Sq, D], k, v [B, Hkv, Skv, D]; with bshd, transposed views of [B, S, H, D] storage."""
    g = _gen(seed)

    def make(heads, length):
        if bshd:
            return torch.randn(batch, length, heads, dim, generator=g, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(batch, heads, length, dim, generator=g, device="cuda", dtype=dtype)

    return make(heads_q, q_len), make(heads_kv, kv_len), make(heads_kv, kv_len)


def assert_matches_reference(q, k, v, mask, *, scale=None, softcap=None, ref_mask=None, lse_atol=LSE_ATOL):
    """Runs the kernel and the reference; checks every element of out and lse."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out, lse = library.forward(q, k, v, *mask.as_tuple(), scale, softcap)
    ref_out, ref_lse = reference.attention_forward(q, k, v, mask if ref_mask is None else ref_mask, scale, softcap)
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride() == library.output_strides(q)
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    assert torch.isfinite(out).all(), "the kernel left NaN / inf in out"
    assert not torch.isnan(lse).any(), "the kernel left NaN in lse"
    empty = ref_lse == -math.inf
    assert torch.equal(lse == -math.inf, empty), "empty rows differ"
    assert (out[empty] == 0).all(), "a row with no allowed key must output exactly 0"
    err = ((out.float() - ref_out.float()).norm() / ref_out.float().norm()).item()
    assert err <= OUT_TOL[q.dtype], f"relative error {err:.2e} > {OUT_TOL[q.dtype]:.0e}"
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=lse_atol, rtol=0)
    return out, lse


def random_block_dense(batch, heads, q_len, kv_len, block_q, block_kv, seed) -> torch.Tensor:
    """Dense bool [batch, heads, q_len, kv_len] drawn per (Q block, KV block) as none / all / the causal
    triangle (absolute positions, bottom-right aligned) / random bits, so every block type appears."""
    g = _gen(seed)
    n_q, n_k = -(-q_len // block_q), -(-kv_len // block_kv)
    kind = torch.randint(0, 4, (batch, heads, n_q, n_k), generator=g, device="cuda")
    rows, cols = torch.arange(q_len, device="cuda"), torch.arange(kv_len, device="cuda")
    kind = kind[:, :, rows // block_q][:, :, :, cols // block_kv]
    causal = (rows[:, None] + kv_len - q_len) >= cols[None, :]
    bits = torch.rand(batch, heads, q_len, kv_len, generator=g, device="cuda") < 0.5
    return (kind == 1) | ((kind == 2) & causal) | ((kind == 3) & bits)
