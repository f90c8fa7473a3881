"""The additive score bias (``omni_attention(..., bias=)``) on the kernels, against a float64 definition.

The definition (`tests.helpers.bias_checks.bias_definition`) adds the bias to dense float64 scores, sets masked
pairs to -inf and takes the softmax: nothing of the kernels' tiling or of the reference's chunking is shared. bf16
q, k, v (B = 2, 8 query / 2 KV heads, head dims 64, 128, 256 and 512; 700 query rows over 1000 keys and 1000 over
1000, crossing the 64- and 128-row tiles), every mask kind with rows that see no key, and the bias layouts that
matter: T5's permuted ``[1, H, Sq, Skv]`` bf16 view (last-dim stride H: read one element at a time, its gradient
summed over the batch by float32 atomics) and full ``[B, H, Sq, Skv]`` float32 and bf16 biases (read two keys at a
time, each gradient element stored once in the bias's dtype), and the bf16 layout the Hopper backward stages in
shared memory at its edges (rows padded past a key count that is no multiple of 8, per batch row or broadcast over
it). The kernels' out, lse and every gradient (dq, dk, dv, and the bias's, summed by the op's atomics over the
broadcast heads) must stay within `ROUNDINGS_BOUND` of the bf16 reference's own error. Decoding-shaped calls (1 and
4 query rows over 3000 keys) are checked forward. A bias that needs no gradient gets no accumulator; NaN at masked
pairs changes nothing. On a Hopper GPU every case runs on both kernel families (``kernel_path``); the library fills
its outputs with NaN first (``poisoned_outputs``); GPU cases skip without the library.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from omni_hf import OmniBlockMask
from omni_hf.ops import library
from tests.helpers.bias_checks import BIAS_LAYOUTS, bias_leaf, run_definition, run_omni
from tests.helpers.brute_force import masks_of_every_kind, relative_error

ROUNDINGS_BOUND = 4.0  # kernel error / same-dtype reference error, as in the backward's and the sinks' tests
FLOOR = 1e-3  # bf16's half-ulp: where the reference rounds exactly, the kernel may still round once

# name: (a layout of tests.helpers.bias_checks.BIAS_LAYOUTS, the bias's dtype)
LAYOUTS = {
    "T5 [1, H, Sq, Skv] bf16": ("[1, Hq, Sq, Skv] T5 view", torch.bfloat16),
    "[B, H, Sq, Skv] float32": ("[B, Hq, Sq, Skv]", torch.float32),
    "[B, H, Sq, Skv] bf16": ("[B, Hq, Sq, Skv]", torch.bfloat16),  # read in pairs, its gradient stored in bf16
}
WHATS = ("dq", "dk", "dv", "dbias")


def _inputs(batch, heads_q, heads_kv, q_len, kv_len, dim, gen):
    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device="cuda", dtype=torch.bfloat16)

    q, k, v = rand(batch, heads_q, q_len, dim), rand(batch, heads_kv, kv_len, dim), rand(batch, heads_kv, kv_len, dim)
    return q, k, v, rand(batch, heads_q, q_len, dim)


def _kernel_errors_within_bound(inputs, mask, leaf, layout, name, *, bias_grad=True, backward=True, gold_leaf=None,
                                sinks=None):
    """The kernels' out, lse and gradients (dsinks too, with ``sinks``) against the float64 definition (on
    ``gold_leaf``, default ``leaf``) stay within ROUNDINGS_BOUND of the bf16 reference's own error (plus `FLOOR`);
    returns the kernels' (out, lse, grads)."""
    got = run_omni(*inputs, mask, leaf, layout, sinks=sinks, bias_grad=bias_grad, backward=backward)
    gold_out, gold_lse, gold_grads = run_definition(*inputs, mask, leaf if gold_leaf is None else gold_leaf, layout,
                                                    sinks=sinks, backward=backward)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNI_HF_BACKEND", "reference")
        ref_out, ref_lse, ref_grads = run_omni(*inputs, mask, leaf, layout, sinks=sinks, bias_grad=bias_grad,
                                               backward=backward)
    out, lse, grads = got
    assert torch.isfinite(out).all(), name
    live = torch.isfinite(gold_lse)
    assert torch.equal(torch.isfinite(lse), live), name
    assert relative_error(out, gold_out) <= ROUNDINGS_BOUND * relative_error(ref_out, gold_out) + FLOOR, name
    lse_error, ref_lse_error = ((x.double() - gold_lse)[live].abs().max() for x in (lse, ref_lse))
    assert lse_error < 1e-3 + ref_lse_error, (name, float(lse_error))
    for grad, ref, gold, what in zip(grads, ref_grads, gold_grads, WHATS + ("dsinks",)):
        if what == "dbias" and not bias_grad:
            assert grad is None and ref is None, name
            continue
        assert grad.shape == gold.shape and (what != "dbias" or grad.dtype == leaf.dtype), (name, what)
        assert torch.isfinite(grad).all(), (name, what)
        error, ref_error = relative_error(grad, gold), relative_error(ref, gold)
        assert error <= ROUNDINGS_BOUND * ref_error + FLOOR, (name, what, error, ref_error)
    return got


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path", "poisoned_outputs")
@pytest.mark.parametrize("q_len, kv_len", [(700, 1000), (1000, 1000)])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dim", [64, 128, 256, 512])
def test_bias_on_the_kernels_matches_the_definition(dim, layout, q_len, kv_len):
    gen = torch.Generator().manual_seed(dim + q_len)
    inputs = _inputs(2, 8, 2, q_len, kv_len, dim, gen)
    bias_layout, dtype = LAYOUTS[layout]
    leaf = bias_leaf(bias_layout, 2, 8, q_len, kv_len, dtype, "cuda", gen)
    for name, mask in masks_of_every_kind(2, 8, q_len, kv_len, "cuda", gen):
        _kernel_errors_within_bound(inputs, mask, leaf, bias_layout, f"{name}, {layout}")


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path", "poisoned_outputs")
@pytest.mark.parametrize("broadcast", [False, True])
@pytest.mark.parametrize("dim", [64, 128])
def test_a_staged_bias_at_its_edges_matches_the_definition(dim, broadcast, monkeypatch):
    """The layout the sm_90a backward copies into shared memory (2-byte keys contiguous, rows 16-byte aligned) at its
    edges: bf16 rows padded to 1008 elements past 1001 keys, so the last 16-byte copy of each row is partly
    zero-filled, per batch row (its gradient stored in bf16) or broadcast over the batch (its gradient added by
    float32 atomics); B 2, 8 / 2 heads, 700 x 1001 crossing the 64-row and 128-key tiles, every mask kind."""
    q_len, kv_len, pitch = 700, 1001, 1008
    layout = "[1|B, Hq, Sq, Skv] bf16, rows padded"
    monkeypatch.setitem(BIAS_LAYOUTS, layout, (lambda b, h, s, k: (1 if broadcast else b, h, s, pitch),
                                               lambda t: t[..., :kv_len]))
    gen = torch.Generator().manual_seed(dim + broadcast)
    inputs = _inputs(2, 8, 2, q_len, kv_len, dim, gen)
    leaf = bias_leaf(layout, 2, 8, q_len, kv_len, torch.bfloat16, "cuda", gen)
    for name, mask in masks_of_every_kind(2, 8, q_len, kv_len, "cuda", gen):
        _kernel_errors_within_bound(inputs, mask, leaf, layout, f"{name}, broadcast={broadcast}")


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path", "poisoned_outputs")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("q_len", [1, 4])  # 4 query heads a KV head: up to 16 rows, the decode path's shapes
def test_bias_on_decoding_shaped_calls_matches_the_definition(q_len, layout):
    gen = torch.Generator().manual_seed(q_len)
    kv_len = 3000
    inputs = _inputs(2, 8, 2, q_len, kv_len, 128, gen)
    bias_layout, dtype = LAYOUTS[layout]
    leaf = bias_leaf(bias_layout, 2, 8, q_len, kv_len, dtype, "cuda", gen)
    masks = (OmniBlockMask.causal(q_len, kv_len), OmniBlockMask.causal(q_len, kv_len, window=300),
             OmniBlockMask.full(q_len, kv_len))
    for mask in masks:
        _kernel_errors_within_bound(inputs, mask, leaf, bias_layout, f"decode q_len={q_len}, {layout}",
                                    backward=False)


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path", "poisoned_outputs")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_bias_that_needs_no_gradient_gets_no_accumulator(layout, monkeypatch):
    """q, k and v need gradients, the bias none: the backward op is handed no dbias and the bias gets no gradient,
    while dq, dk and dv still hold the bias's effect."""
    gen = torch.Generator().manual_seed(3)
    inputs = _inputs(2, 8, 2, 700, 1000, 128, gen)
    bias_layout, dtype = LAYOUTS[layout]
    leaf = bias_leaf(bias_layout, 2, 8, 700, 1000, dtype, "cuda", gen)
    handed = []
    backward = library.backward

    def spy(*args, **kwargs):
        handed.append(inspect.signature(backward).bind(*args, **kwargs).arguments.get("dbias"))
        return backward(*args, **kwargs)

    monkeypatch.setattr(library, "backward", spy)
    mask = OmniBlockMask.causal(700, 1000)
    _kernel_errors_within_bound(inputs, mask, leaf, bias_layout, layout, bias_grad=False)
    assert handed == [None]  # the kernels' backward ran once (the reference's is not library.backward)


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path", "poisoned_outputs")
@pytest.mark.parametrize("dim", [64, 128])
def test_bias_with_sinks_on_the_kernels_matches_the_definition(dim):
    """Sinks join the denominators of rows the bias shifts: out, lse and every gradient, the sinks' (summed by the
    backward's preprocess) and the bias's included, on T5's layout and every mask kind."""
    gen = torch.Generator().manual_seed(31 + dim)
    inputs = _inputs(2, 8, 2, 700, 1000, dim, gen)
    bias_layout, dtype = LAYOUTS["T5 [1, H, Sq, Skv] bf16"]
    leaf = bias_leaf(bias_layout, 2, 8, 700, 1000, dtype, "cuda", gen)
    sinks = (torch.randn(8, generator=gen) * 2).to("cuda")
    for name, mask in masks_of_every_kind(2, 8, 700, 1000, "cuda", gen):
        _kernel_errors_within_bound(inputs, mask, leaf, bias_layout, f"{name}, sinks", sinks=sinks)


@pytest.mark.gpu
@pytest.mark.usefixtures("kernel_path", "poisoned_outputs")
def test_masked_pairs_never_read_the_bias_on_the_kernels():
    """NaN in a float32 [B, H, Sq, Skv] bias wherever the mask forbids a pair: the kernels' results stay within the
    bound of the definition's on the finite bias, and the bias's gradient there is exactly 0."""
    gen = torch.Generator().manual_seed(21)
    inputs = _inputs(2, 8, 2, 700, 1000, 128, gen)
    leaf = bias_leaf("[B, Hq, Sq, Skv]", 2, 8, 700, 1000, torch.float32, "cuda", gen)
    for name, mask in masks_of_every_kind(2, 8, 700, 1000, "cuda", gen):
        allowed = mask.to_dense().to("cuda").expand(2, 8, 700, 1000)
        poisoned = torch.where(allowed, leaf, float("nan"))
        _, _, grads = _kernel_errors_within_bound(inputs, mask, poisoned, "[B, Hq, Sq, Skv]", name, gold_leaf=leaf)
        assert (grads[3][~allowed] == 0).all(), name
