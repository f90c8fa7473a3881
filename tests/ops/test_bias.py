"""The additive score bias (``omni_attention(..., bias=)``) on the reference, against a float64 definition.

Fresh random inputs (B = 2, GQA 4 query / 2 KV heads, 150 query rows over 260 keys and 130 over 130, crossing the
64- and 128-row tiles), every bias layout a model hands over (T5's permuted ``[1, Hq, Sq, Skv]`` view, per batch row,
full, 3-dim and 2-dim broadcasts), float32 and bfloat16 biases, every mask kind with rows that see no key, with and
without sinks; the reference runs in chunks of a few dozen query rows so that the bias's rows and its gradient
cross chunks. out, lse, dq, dk, dv, the bias's gradient (and dsinks) must match to float32 accuracy. Bad biases are
refused by name, with what was expected and what was received; a compiled step with a bias matches eager.
"""

from __future__ import annotations

import pytest
import torch

from omni_hf import OmniBlockMask, omni_attention
from omni_hf.ops import reference
from tests.helpers.bias_checks import BIAS_LAYOUTS, bias_leaf, run_definition, run_omni
from tests.helpers.brute_force import masks_of_every_kind, relative_error

CHUNK_ROWS = 37  # query rows of one reference chunk here: several chunks per call, none aligned to a tile


def _inputs(batch, heads_q, heads_kv, q_len, kv_len, dim, gen):
    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    q, k, v = rand(batch, heads_q, q_len, dim), rand(batch, heads_kv, kv_len, dim), rand(batch, heads_kv, kv_len, dim)
    return q, k, v, rand(batch, heads_q, q_len, dim)


@pytest.fixture
def small_chunks(monkeypatch):
    """The reference's chunks hold `CHUNK_ROWS` query rows of B = 2, Hq = 4 at the longest key length here."""
    monkeypatch.setattr(reference, "_CHUNK_ELEMENTS", CHUNK_ROWS * 2 * 4 * 260)


def _assert_matches_definition(got, gold, name, bias_dtype):
    (out, lse, grads), (gold_out, gold_lse, gold_grads) = got, gold
    assert relative_error(out, gold_out) < 1e-5, name
    assert torch.equal(torch.isfinite(lse), torch.isfinite(gold_lse)), name
    torch.testing.assert_close(lse.double(), gold_lse, rtol=1e-5, atol=1e-5, msg=name)
    whats = ("dq", "dk", "dv", "dbias", "dsinks")
    assert len(grads) == len(gold_grads)
    for grad, gold_grad, what in zip(grads, gold_grads, whats):
        # a bfloat16 bias gets its gradient in bfloat16: one rounding, 2^-9 relative
        tolerance = 2.0 ** -8 if what == "dbias" and bias_dtype == torch.bfloat16 else 1e-5
        assert grad.shape == gold_grad.shape, (name, what)
        assert relative_error(grad, gold_grad) < tolerance, (name, what, relative_error(grad, gold_grad))


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("layout", list(BIAS_LAYOUTS))
@pytest.mark.parametrize("q_len, kv_len", [(150, 260), (130, 130)])
def test_bias_on_the_reference_matches_the_definition(layout, bias_dtype, q_len, kv_len):
    gen = torch.Generator().manual_seed(q_len + kv_len + len(layout))
    inputs = _inputs(2, 4, 2, q_len, kv_len, 32, gen)
    leaf = bias_leaf(layout, 2, 4, q_len, kv_len, bias_dtype, "cpu", gen)
    for name, mask in masks_of_every_kind(2, 4, q_len, kv_len, "cpu", gen):
        got = run_omni(*inputs, mask, leaf, layout, scale=0.3)
        assert got[2][3].dtype == bias_dtype and got[2][3].shape == leaf.shape, name
        _assert_matches_definition(got, run_definition(*inputs, mask, leaf, layout, scale=0.3), name, bias_dtype)


def test_the_t5_layout_reaches_the_op_as_a_strided_view():
    leaf = bias_leaf("[1, Hq, Sq, Skv] T5 view", 2, 4, 150, 260, torch.float32, "cpu", torch.Generator())
    bias = BIAS_LAYOUTS["[1, Hq, Sq, Skv] T5 view"][1](leaf)
    assert bias.shape == (1, 4, 150, 260) and bias.stride(-1) == 4 and not bias.is_contiguous()


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("layout", ["[1, Hq, Sq, Skv] T5 view", "[B, Hq, Sq, Skv]", "[Sq, Skv]"])
def test_bias_with_sinks_matches_the_definition(layout):
    """Sinks join the denominators of rows the bias shifts; rows with no allowed key output 0 with the sink as lse."""
    gen = torch.Generator().manual_seed(11)
    inputs = _inputs(2, 4, 2, 150, 260, 32, gen)
    sinks = torch.randn(4, generator=gen) * 2
    leaf = bias_leaf(layout, 2, 4, 150, 260, torch.float32, "cpu", gen)
    for name, mask in masks_of_every_kind(2, 4, 150, 260, "cpu", gen):
        got = run_omni(*inputs, mask, leaf, layout, sinks=sinks)
        gold = run_definition(*inputs, mask, leaf, layout, sinks=sinks)
        _assert_matches_definition(got, gold, name, torch.float32)
        no_key = ~mask.to_dense().expand(2, 4, 150, 260).any(-1)
        assert no_key.any() == (name in ("token rule", "token rule, window", "dense")), name
        assert torch.equal(got[1][no_key], sinks[None, :, None].expand(2, 4, 150)[no_key]), name


@pytest.mark.usefixtures("small_chunks")
def test_masked_pairs_never_read_the_bias_and_get_zero_gradient():
    """NaN in the bias wherever the mask forbids a pair changes nothing; there its gradient is exactly 0, and rows
    with no allowed key output 0 with lse -inf."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, dout = _inputs(2, 4, 2, 150, 260, 32, gen)
    leaf = bias_leaf("[B, Hq, Sq, Skv]", 2, 4, 150, 260, torch.float32, "cpu", gen)
    for name, mask in masks_of_every_kind(2, 4, 150, 260, "cpu", gen):
        allowed = mask.to_dense().expand(2, 4, 150, 260)
        poisoned = torch.where(allowed, leaf, float("nan"))
        got = run_omni(q, k, v, dout, mask, poisoned, "[B, Hq, Sq, Skv]")
        _assert_matches_definition(got, run_definition(q, k, v, dout, mask, leaf, "[B, Hq, Sq, Skv]"), name,
                                   torch.float32)
        out, lse, (dq, _, _, dbias) = got
        assert torch.equal(dbias[~allowed], torch.zeros_like(dbias[~allowed])), name
        no_key = ~allowed.any(-1)
        assert torch.equal(out[no_key], torch.zeros_like(out[no_key])), name
        assert torch.equal(dq[no_key], torch.zeros_like(dq[no_key])), name
        assert (lse[no_key] == float("-inf")).all(), name
        with torch.no_grad():
            assert torch.equal(omni_attention(q, k, v, mask, bias=poisoned), out), name


def test_no_bias_gradient_is_made_where_the_bias_needs_none(monkeypatch):
    """A bias that needs no gradient gets none, and the backward is not handed an accumulator for it; one that needs
    it gets a float32 accumulator of its own (un-broadcast) shape."""
    gen = torch.Generator().manual_seed(9)
    q, k, v, dout = _inputs(2, 4, 2, 100, 130, 32, gen)
    leaf = bias_leaf("[Hq, Sq, Skv]", 2, 4, 100, 130, torch.bfloat16, "cpu", gen)
    handed = []
    backward = reference.attention_backward

    def spy(*args):
        handed.append(args[-1])
        return backward(*args)

    monkeypatch.setattr(reference, "attention_backward", spy)
    mask = OmniBlockMask.causal(100, 130)
    _, _, grads = run_omni(q, k, v, dout, mask, leaf, "[Hq, Sq, Skv]", bias_grad=False)
    assert grads[3] is None and handed == [None]
    assert all(g is not None for g in grads[:3])
    _, _, grads = run_omni(q, k, v, dout, mask, leaf, "[Hq, Sq, Skv]")
    assert handed[1].dtype == torch.float32 and handed[1].shape == (4, 100, 130)
    assert grads[3].dtype == torch.bfloat16 and grads[3].shape == (4, 100, 130)


# ---------------------------------------------------------------------- refusals


def _small():
    q, k, v, _ = _inputs(2, 4, 2, 8, 10, 16, torch.Generator().manual_seed(2))
    return q, k, v, OmniBlockMask.causal(8, 10)


@pytest.mark.parametrize("bias, error, message", [
    ([[0.0] * 10] * 8, TypeError, r"bias: expected a torch.Tensor broadcastable to \[B, Hq, Sq, Skv\] or None, got "
                                  r"list"),
    (torch.zeros(1, 2, 4, 8, 10), ValueError, r"bias: expected a shape broadcastable to \[B, Hq, Sq, Skv\] = "
                                              r"\[2, 4, 8, 10\] .*, got \(1, 2, 4, 8, 10\)"),
    (torch.zeros(2, 2, 8, 10), ValueError, r"bias: expected a shape broadcastable to \[B, Hq, Sq, Skv\] = "
                                           r"\[2, 4, 8, 10\] .*, got \(2, 2, 8, 10\)"),
    (torch.zeros(8, 8), ValueError, r"bias: expected a shape broadcastable to \[B, Hq, Sq, Skv\] = \[2, 4, 8, 10\] "
                                    r".*, got \(8, 8\)"),
    (torch.zeros(3, 1, 8, 10), ValueError, r"= \[2, 4, 8, 10\] .*, got \(3, 1, 8, 10\)"),
    (torch.zeros(8, 10, dtype=torch.float64), TypeError, r"bias: expected dtype torch.float32, torch.float16 or "
                                                         r"torch.bfloat16, got torch.float64"),
    (torch.zeros(8, 10, dtype=torch.int64), TypeError, r"bias: expected dtype .*, got torch.int64"),
    (torch.zeros(8, 10, device="meta"), ValueError, r"bias: expected device cpu \(that of q\), got meta"),
], ids=["not a tensor", "5 dims", "heads", "keys", "batch", "float64", "int64", "device"])
def test_bad_biases_are_refused_by_name_with_what_was_expected_and_received(bias, error, message):
    q, k, v, mask = _small()
    with pytest.raises(error, match=message):
        omni_attention(q, k, v, mask, bias=bias)


def test_bias_with_softcap_is_refused():
    q, k, v, mask = _small()
    with pytest.raises(ValueError, match=r"bias: softcap and bias cannot be combined: expected softcap=None with a "
                                         r"bias, got softcap=30.0"):
        omni_attention(q, k, v, mask, softcap=30.0, bias=torch.zeros(8, 10))


# ---------------------------------------------------------------------- torch.compile


def test_torch_compile_fullgraph_step_with_a_bias_matches_eager():
    """T5's layout: the bias a view of a leaf that needs a gradient; the compiled step's loss and every gradient (the
    leaf's through the op's dbias) as eager's."""
    gen = torch.Generator().manual_seed(4)
    q, k, v, _ = (t.requires_grad_() for t in _inputs(2, 4, 2, 100, 130, 32, gen))
    values = bias_leaf("[1, Hq, Sq, Skv] T5 view", 2, 4, 100, 130, torch.float32, "cpu", gen).requires_grad_()
    doc = (torch.arange(130) >= 50).int().repeat(2, 1)
    doc[1, :40] = -1
    mask = OmniBlockMask.from_token_ids(doc, torch.full_like(doc, -1), q_len=100)

    def loss(q, k, v, values, mask):
        bias = values.permute(2, 0, 1).unsqueeze(0)
        return omni_attention(q, k, v, mask, bias=bias, scale=1.0).square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    value = compiled(q, k, v, values, mask)
    grads = torch.autograd.grad(value, (q, k, v, values))
    eager_value = loss(q, k, v, values, mask)
    eager_grads = torch.autograd.grad(eager_value, (q, k, v, values))
    torch.testing.assert_close(value, eager_value)
    for a, b in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b)
    assert grads[3].abs().sum() > 0
