"""The additive score bias (``omni_attention(..., bias=)``) in tests: a float64 definition written from the op's
contract (dense scores plus bias, masked pairs -inf, a softmax over the row; nothing of the implementation's
chunking or broadcasting shared), the bias layouts models hand over, masks of every kind with rows that see no key,
and one call of the op and of the definition on leaf copies of the inputs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from omni_hf import omni_attention


def bias_definition(q, k, v, allowed, scale, bias, sinks=None):
    """float64 attention with an additive bias, autograd through everything: ``scale * q.k + bias`` where
    ``allowed`` (bool broadcastable to ``[B, Hq, Sq, Skv]``), -inf elsewhere; with ``sinks`` ``[Hq]``, one more column
    of each row holds its head's sink. Rows with neither an allowed key nor a sink give out 0, lse -inf and no
    gradient. Returns out ``[B, Hq, Sq, D]``, lse ``[B, Hq, Sq]``."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k) * scale + bias.double()
    allowed = allowed.expand_as(s)
    s = torch.where(allowed, s, float("-inf"))
    has_key = allowed.any(-1, keepdim=True)
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(*s.shape[:3], 1)], -1)
        has_key = torch.ones_like(has_key)
    s = torch.where(has_key, s, 0.0)
    p = torch.softmax(s, -1) * has_key
    lse = torch.where(has_key, torch.logsumexp(s, -1, keepdim=True), float("-inf")).squeeze(-1)
    if sinks is not None:
        p = p[..., :-1]
    return torch.einsum("bhqk,bhkd->bhqd", p, v), lse


# name: (the leaf's shape from (B, Hq, Sq, Skv), the bias the op receives as a view of the leaf)
BIAS_LAYOUTS: dict[str, tuple[Callable[..., tuple[int, ...]], Callable[[torch.Tensor], torch.Tensor]]] = {
    # T5's compute_bias: an embedding's [Sq, Skv, H] output permuted, so the last dim has stride H
    "[1, Hq, Sq, Skv] T5 view": (lambda b, h, s, k: (s, k, h), lambda t: t.permute(2, 0, 1).unsqueeze(0)),
    "[B, 1, Sq, Skv]": (lambda b, h, s, k: (b, 1, s, k), lambda t: t),
    "[B, Hq, Sq, Skv]": (lambda b, h, s, k: (b, h, s, k), lambda t: t),
    "[Hq, Sq, Skv]": (lambda b, h, s, k: (h, s, k), lambda t: t),
    "[Sq, Skv]": (lambda b, h, s, k: (s, k), lambda t: t),
}


def bias_leaf(layout: str, batch, heads_q, q_len, kv_len, dtype, device, gen) -> torch.Tensor:
    """Random bias values (the leaf whose view `BIAS_LAYOUTS` gives the op), about the size of the scores, so that
    the bias moves the softmax."""
    shape = BIAS_LAYOUTS[layout][0](batch, heads_q, q_len, kv_len)
    return (torch.randn(shape, generator=gen) * 2).to(device=device, dtype=dtype)


def run_omni(q, k, v, dout, mask, leaf, layout, *, sinks=None, scale=None, bias_grad=True, backward=True):
    """out, lse and the gradients (dq, dk, dv, the bias leaf's, dsinks where sinks are given) of `omni_attention`
    on leaf copies of the inputs; the bias leaf needs no gradient unless ``bias_grad`` (its gradient is then None).
    Without ``backward``, a forward under no_grad (no gradients)."""
    if not backward:
        with torch.no_grad():
            out, lse = omni_attention(q, k, v, mask, scale=scale, sinks=sinks, bias=BIAS_LAYOUTS[layout][1](leaf),
                                      return_lse=True)
        return out, lse, []
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    bias = leaf.detach().clone().requires_grad_(bias_grad)
    sink_leaf = None if sinks is None else sinks.detach().clone().requires_grad_()
    out, lse = omni_attention(*leaves, mask, scale=scale, sinks=sink_leaf, bias=BIAS_LAYOUTS[layout][1](bias),
                              return_lse=True)
    out.backward(dout)
    grads = [t.grad for t in leaves] + [bias.grad] + ([] if sink_leaf is None else [sink_leaf.grad])
    return out, lse, grads


def run_definition(q, k, v, dout, mask, leaf, layout, *, sinks=None, scale=None, backward=True):
    """`run_omni`'s outputs and gradients from `bias_definition` in float64 (the bias leaf's gradient always;
    none without ``backward``)."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, leaf)]
    sink_leaf = None if sinks is None else sinks.detach().double().requires_grad_()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    bias = BIAS_LAYOUTS[layout][1](leaves[3])
    out, lse = bias_definition(*leaves[:3], mask.to_dense().to(q.device), scale, bias, sink_leaf)
    if not backward:
        return out.detach(), lse.detach(), []
    out.backward(dout.double())
    return out, lse, [t.grad for t in leaves] + ([] if sink_leaf is None else [sink_leaf.grad])
