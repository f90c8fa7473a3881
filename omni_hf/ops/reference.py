"""Exact attention in PyTorch: the oracle of every test and the CPU path of `omni_attention`.

Scores and softmax run in float32 (float64 for float64 inputs), chunked over query rows so memory stays
at ``chunk x kv_len`` per head: S = 16k runs on a CPU. GQA shares each K/V head among its query heads
by a view, never a copy. A query row with no allowed key gives output 0, LSE = -inf (the sink's logit where the
call has sinks) and zero gradient. The backward needs no sinks: ``P = exp(s - lse)`` holds them through the LSE.

An additive score bias (``bias``, broadcastable to ``[B, Hq, Sq, Skv]``, as T5's relative position bias) joins the
scores after the softcap and before the mask, chunk by chunk: the chunk's rows of bias, in the accumulation dtype,
viewed in the grouped layout ``[B|1, Hkv|1, G|1, rows, Skv|1]`` and added to the scores by broadcasting (no copy of
more than one chunk of it). Masked pairs become -inf whatever bias holds there. Its gradient is the gradient of the
logits, ``ds``, summed per chunk over the dims where bias broadcasts and added into a caller's accumulator of bias's
shape (`attention_backward`'s ``dbias``), as the CUDA op adds it; masked pairs and rows with no allowed key add 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..mask import OmniBlockMask

__all__ = ["attention_forward", "attention_backward", "sink_gradient", "summed_to_broadcast"]

_CHUNK_ELEMENTS = 1 << 24  # score elements of one query-row chunk


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: OmniBlockMask | torch.Tensor,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention.

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Skv, D]`` with ``Hq % Hkv == 0``; any float dtype and strides.
        mask: an `OmniBlockMask`, or a dense bool ``[B|1, Hq|1, Sq, Skv]`` (True = allowed).
        scale: multiplies ``q.k`` (default ``D ** -0.5``); softcap: ``s -> softcap * tanh(s / softcap)``.
        sinks: None, or ``[Hq]`` float: each query head's sink logit, one more term ``exp(sink)`` of every row's
            softmax denominator that takes no value.
        bias: None, or a float tensor broadcastable to ``[B, Hq, Sq, Skv]`` (any strides): added to the (softcapped)
            scores where the mask allows.
    Returns:
        out ``[B, Hq, Sq, D]`` in q's dtype and lse float32 ``[B, Hq, Sq]`` (natural log, the sink included; -inf
        on empty rows without a sink, the sink's logit on empty rows with one).
    """
    scale = _scale(q, scale)
    batch, heads_q, q_len, dim = q.shape
    out = torch.empty(batch, heads_q, q_len, dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads_q, q_len, dtype=torch.float32, device=q.device)
    acc, heads_kv = _accumulation_dtype(q), k.shape[1]
    kf, vf = _grouped(k, acc), _grouped(v, acc)
    sink = None if sinks is None else sinks.to(acc).reshape(1, heads_kv, heads_q // heads_kv, 1, 1)
    for start, stop in _chunks(q, k):
        allowed = _mask_rows(mask, start, stop, heads_kv, q.device)
        s, _ = _scores(_grouped_q(q, heads_kv, start, stop, acc), kf, scale, softcap)
        if bias is not None:
            s += _bias_rows(bias, start, stop, heads_kv, acc)
        s = s.masked_fill_(~allowed, float("-inf"))
        row_max = s.amax(-1, keepdim=True)
        if sink is not None:
            row_max = torch.maximum(row_max, sink)
        row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
        e = torch.exp_(s.sub_(row_max))
        total = e.sum(-1, keepdim=True)
        if sink is not None:
            total = total + torch.exp(sink - row_max)
        out[:, :, start:stop] = _ungroup((e @ vf) / torch.where(total > 0, total, 1.0)).to(q.dtype)
        lse[:, :, start:stop] = _ungroup((row_max + torch.log(total)).squeeze(-1)).float()
    return out, lse


def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: OmniBlockMask | torch.Tensor,
    scale: float | None = None,
    softcap: float | None = None,
    bias: torch.Tensor | None = None,
    dbias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `attention_forward` from its saved ``out`` and ``lse`` (the kernels' recipe).

    Args:
        dout: ``[B, Hq, Sq, D]``; the others as in `attention_forward` and its outputs (``bias`` the forward's).
        dbias: None, or a contiguous float32 (float64 for float64 inputs) tensor of bias's shape into which the
            gradient of bias is added: the gradient of the logits summed over the dims where bias broadcasts (the
            CUDA op's contract, with the accumulator un-expanded). Needs ``bias`` and no softcap.
    Returns:
        dq ``[B, Hq, Sq, D]``, dk and dv ``[B, Hkv, Skv, D]`` (summed over each group's query heads),
        in the dtypes of q, k, v.
    """
    scale = _scale(q, scale)
    acc, heads_kv = _accumulation_dtype(q), k.shape[1]
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    kf, vf = _grouped(k, acc), _grouped(v, acc)
    dk = torch.zeros_like(kf, memory_format=torch.contiguous_format)  # contiguous, as the fake op promises
    dv = torch.zeros_like(dk)
    for start, stop in _chunks(q, k):
        allowed = _mask_rows(mask, start, stop, heads_kv, q.device)
        qc, doc, oc, row_lse = (_grouped_q(x, heads_kv, start, stop, acc) for x in (q, dout, out, lse[..., None]))
        s, tanh = _scores(qc, kf, scale, softcap)
        if bias is not None:
            s += _bias_rows(bias, start, stop, heads_kv, acc)
        live = allowed & torch.isfinite(row_lse)
        p = torch.where(live, torch.exp(s - torch.where(torch.isfinite(row_lse), row_lse, 0.0)), 0.0)
        dv += (p.transpose(-1, -2) @ doc).sum(2, keepdim=True)
        dp = doc @ vf.transpose(-1, -2)
        ds = p * (dp - (doc * oc).sum(-1, keepdim=True))
        if dbias is not None:
            _add_bias_gradient(dbias, ds, start, stop)
        if tanh is not None:
            ds = ds * (1 - tanh * tanh)
        dq[:, :, start:stop] = _ungroup(ds @ kf * scale).to(q.dtype)
        dk += (ds.transpose(-1, -2) @ qc).sum(2, keepdim=True) * scale
    return dq, dk.squeeze(2).to(k.dtype), dv.squeeze(2).to(v.dtype)


def sink_gradient(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The gradient of the sink logits: ``dsink[h] = -sum over b, rows of exp(sinks[h] - lse) * rowsum(dout * out)``.

    Args:
        dout, out: ``[B, Hq, Sq, D]``; lse: float32 ``[B, Hq, Sq]`` (the forward's, sink included); sinks: ``[Hq]``.
    Returns:
        ``[Hq]`` in sinks' dtype, reduced on the device (no host sync).
    """
    acc = torch.float64 if out.dtype == torch.float64 else torch.float32
    row_dot = (dout.to(acc) * out.to(acc)).sum(-1)
    weight = torch.exp(sinks.to(acc)[None, :, None] - lse.to(acc))
    return -(weight * row_dot).sum((0, 2)).to(sinks.dtype)


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def _accumulation_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _chunks(q: torch.Tensor, k: torch.Tensor):
    """Query-row ranges whose score block holds at most `_CHUNK_ELEMENTS` elements."""
    batch, heads, q_len, _ = q.shape
    rows = max(1, _CHUNK_ELEMENTS // max(1, batch * heads * k.shape[2]))
    for start in range(0, q_len, rows):
        yield start, min(start + rows, q_len)


def _grouped(kv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """K or V ``[B, Hkv, Skv, D]`` as ``[B, Hkv, 1, Skv, D]`` in ``dtype``."""
    return kv.to(dtype)[:, :, None]


def _grouped_q(x: torch.Tensor, heads_kv: int, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``start:stop`` of a query-side tensor ``[B, Hq, Sq, X]`` as ``[B, Hkv, G, rows, X]`` in ``dtype``."""
    batch, heads_q = x.shape[:2]
    return x[:, :, start:stop].to(dtype).reshape(batch, heads_kv, heads_q // heads_kv, stop - start, x.shape[-1])


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    """``[B, Hkv, G, ...]`` -> ``[B, Hq, ...]``."""
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _scores(qc, kf, scale, softcap) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``[B, Hkv, G, rows, Skv]`` and, with softcap, the tanh needed by the backward."""
    s = (qc * scale) @ kf.transpose(-1, -2)
    if not softcap:
        return s, None
    tanh = torch.tanh(s / softcap)
    return softcap * tanh, tanh


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """A tensor of at most 4 dims as a 4-dim view, size-1 dims prepended."""
    return x[(None,) * (4 - x.dim())]


def _bias_rows(bias: torch.Tensor, start: int, stop: int, heads_kv: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``start:stop`` of a bias broadcastable to ``[B, Hq, Sq, Skv]`` in ``dtype``, as ``[B|1, Hkv|1, G|1,
    rows|1, Skv|1]`` (broadcast against the grouped scores; a view of bias's own memory where dtype allows)."""
    rows = _as_4d(bias)
    if rows.shape[2] != 1:
        rows = rows[:, :, start:stop]
    rows = rows.to(dtype)
    if rows.shape[1] == 1:
        return rows[:, :, None]
    return rows.unflatten(1, (heads_kv, rows.shape[1] // heads_kv))


def _add_bias_gradient(dbias: torch.Tensor, ds: torch.Tensor, start: int, stop: int) -> None:
    """Adds the gradient of the logits of rows ``start:stop`` (``ds``, ``[B, Hkv, G, rows, Skv]``) into ``dbias``
    (bias's shape), summed over the dims where bias broadcasts."""
    target = _as_4d(dbias)
    grad = summed_to_broadcast(_ungroup(ds), target.shape)
    if target.shape[2] != 1:
        target = target[:, :, start:stop]
    target += grad.to(target.dtype)


def summed_to_broadcast(grad: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``grad`` (4 dims, the call's ``[B, Hq, rows, Skv]`` or part of it) summed over the dims where a bias of
    ``shape`` (at most 4 dims, size-1 dims prepended) broadcasts, keeping them as size 1."""
    padded = (1,) * (4 - len(shape)) + tuple(shape)
    summed = tuple(d for d in range(4) if padded[d] == 1 and grad.shape[d] != 1)
    return grad.sum(summed, keepdim=True) if summed else grad


def _mask_rows(mask: OmniBlockMask | torch.Tensor, start: int, stop: int, heads_kv: int,
               device: torch.device) -> torch.Tensor:
    """bool mask rows ``start:stop`` as ``[B|1, Hkv|1, G|1, rows, Skv]`` (broadcast against the scores; an
    implicit mask's rows are made on ``device``)."""
    rows = mask.dense_rows(start, stop, device) if isinstance(mask, OmniBlockMask) else mask[..., start:stop, :]
    if rows.dim() == 2:
        rows = rows[None, None]
    batch, heads = rows.shape[:2]
    if heads == 1:
        return rows[:, :, None]
    return rows.reshape(batch, heads_kv, heads // heads_kv, *rows.shape[2:])
