"""`omni_attention`: input checks, backend dispatch, and the `torch.library` custom ops with autograd.

The forward and backward are custom ops (``omni_hf::attention_forward`` / ``omni_hf::attention_backward``)
with fake implementations, tied together by one `torch.autograd.Function`, so ``torch.compile(fullgraph=True)``
traces a training step without a graph break. Eager calls skip the ops' dispatch and run the backend directly
(host time matters at small sizes). Both run on one seam, `_backend`: the CUDA library where it can run the
inputs, otherwise the exact PyTorch reference. ``OMNI_HF_BACKEND=cuda|reference`` forces one.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Optional

import torch

from . import reference
from .mask import OmniBlockMask

__all__ = ["omni_attention"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def omni_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: OmniBlockMask,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` over ``k``, ``v`` where ``block_mask`` allows.

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Skv, D]`` with ``Hq % Hkv == 0`` (GQA / MQA, no copy).
            fp16 / bf16 (float32 runs on the reference); any strides with the last dim contiguous;
            ``D`` a multiple of 8, at most 256 (the CUDA kernels take 64 and 128).
        block_mask: an `OmniBlockMask` with ``q_len == Sq``, ``kv_len == Skv``, batch 1 or B, heads 1 or Hq,
            on q's device.
        scale: multiplies ``q.k`` (default ``D ** -0.5``).
        softcap: if set, scores become ``softcap * tanh(score / softcap)``.
        return_lse: also return the log-sum-exp of each row.

    Under autocast, q, k and v are cast to the autocast dtype first, as SDPA does.

    Returns:
        out ``[B, Hq, Sq, D]`` in q's dtype; with ``return_lse``, also lse float32 ``[B, Hq, Sq]``
        (natural log, -inf for rows with no allowed key, whose output is 0). lse is not differentiable.
    """
    q, k, v = _autocast(q, k, v)
    _check_inputs(q, k, v, block_mask, scale, softcap)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    tensors, sizes = block_mask._op_args()
    out, lse = _Attention.apply(q, k, v, sizes, scale, float(softcap or 0.0), *tensors)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------- custom ops


@torch.library.custom_op("omni_hf::attention_forward", mutates_args=())
def attention_forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_tensors: list[Optional[torch.Tensor]],
    mask_sizes: list[int], scale: float, softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward op: out ``[B, Hq, Sq, D]`` and lse float32 ``[B, Hq, Sq]`` (see `omni_attention`)."""
    mask = OmniBlockMask._from_op_args(mask_tensors, mask_sizes)
    forward, _ = _backend(q, k, v, mask)
    return forward(q, k, v, mask, scale, softcap or None)


@attention_forward_op.register_fake
def _(q, k, v, mask_tensors, mask_sizes, scale, softcap):
    out = q.new_empty(q.shape)
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("omni_hf::attention_backward", mutates_args=())
def attention_backward_op(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    mask_tensors: list[Optional[torch.Tensor]], mask_sizes: list[int], scale: float, softcap: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward op: dq, dk, dv shaped like q, k, v."""
    mask = OmniBlockMask._from_op_args(mask_tensors, mask_sizes)
    _, backward = _backend(q, k, v, mask)
    return backward(dout, q, k, v, out, lse, mask, scale, softcap or None)


@attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, mask_tensors, mask_sizes, scale, softcap):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class _Attention(torch.autograd.Function):
    """Autograd of `omni_attention`. Eager calls run the backend directly: the custom ops' dispatch and
    torch.library's autograd wrapper cost more host time than the kernels at small sizes. Under
    torch.compile the custom ops run instead, so the graph stays whole (the ctypes call is opaque to Dynamo).

    ``forward(q, k, v, mask_sizes, scale, softcap, *mask_tensors) -> (out, lse)``; lse is not differentiable.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask_sizes, scale, softcap, *mask_tensors):
        if torch.compiler.is_compiling():
            out, lse = attention_forward_op(q, k, v, list(mask_tensors), mask_sizes, scale, softcap)
        else:
            mask = OmniBlockMask._from_op_args(mask_tensors, mask_sizes)
            forward, backward = _backend(q, k, v, mask)
            out, lse = forward(q, k, v, mask, scale, softcap or None)
            ctx.eager = mask, backward  # the backward runs where the forward ran, without choosing again
        ctx.save_for_backward(q, k, v, out, lse, *mask_tensors)
        ctx.mask_sizes, ctx.scale, ctx.softcap = mask_sizes, scale, softcap
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zeros for lse's gradient
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, *mask_tensors = ctx.saved_tensors
        if grad_out is None:
            grads = (None, None, None)
        elif torch.compiler.is_compiling():
            grads = attention_backward_op(grad_out, q, k, v, out, lse, mask_tensors, ctx.mask_sizes, ctx.scale,
                                          ctx.softcap)
        else:
            mask, backward = ctx.eager
            grads = backward(grad_out, q, k, v, out, lse, mask, ctx.scale, ctx.softcap or None)
        return (*grads, None, None, None, *(None for _ in mask_tensors))


# ---------------------------------------------------------------------- dispatch


_warned_fallback = False


def _backend(q, k, v, mask):
    """The (forward, backward) pair that runs these inputs: the CUDA library's or the reference's.

    Signatures: ``forward(q, k, v, mask, scale, softcap) -> (out, lse)`` and
    ``backward(dout, q, k, v, out, lse, mask, scale, softcap) -> (dq, dk, dv)``.
    """
    choice = os.environ.get("OMNI_HF_BACKEND", "auto")
    if choice not in ("auto", "cuda", "reference"):
        raise ValueError(f"OMNI_HF_BACKEND: expected 'cuda', 'reference' or unset, got {choice!r}")
    exact = reference.attention_forward, reference.attention_backward
    if choice == "reference" or (choice == "auto" and not q.is_cuda):
        return exact
    from . import _cuda

    reason = _cuda.unsupported_reason(q, k, v, mask)
    if reason is None:
        return _cuda.forward, _cuda.backward
    if choice == "cuda":
        raise RuntimeError(f"OMNI_HF_BACKEND=cuda, but the CUDA kernels cannot run these inputs: {reason}")
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"omni_attention: running the PyTorch reference on the GPU ({reason})", stacklevel=3)
    return exact


# ---------------------------------------------------------------------- checks


def _autocast(q, k, v):
    """As SDPA: under autocast, run in the autocast dtype (RoPE hands float32 q and k, the linear a bf16 v)."""
    tensors = (q, k, v)
    if all(isinstance(t, torch.Tensor) for t in tensors) and torch.is_autocast_enabled(q.device.type):
        dtype = torch.get_autocast_dtype(q.device.type)
        return tuple(t.to(dtype) for t in tensors)
    return tensors



def _check_inputs(q, k, v, block_mask, scale, softcap) -> None:
    """Raise TypeError / ValueError naming the argument, what was expected and what was received."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected 4 dims [B, H, S, D], got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}: expected dtype in {SUPPORTED_DTYPES}, got {t.dtype}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} (that of q), got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} (that of q), got {t.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: expected the last dim contiguous (stride 1), got strides {t.stride()}")
    batch, heads_q, q_len, dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[3] != dim:
        raise ValueError(f"k: expected shape [{batch}, Hkv, Skv, {dim}] (batch and head dim of q), got {tuple(k.shape)}")
    if heads_q % k.shape[1] != 0:
        raise ValueError(f"k: expected a head count dividing Hq={heads_q}, got {k.shape[1]}")
    if dim % 8 != 0 or dim > MAX_HEAD_DIM:
        raise ValueError(f"q: expected a head dim that is a multiple of 8 and at most {MAX_HEAD_DIM}, got {dim}")
    _check_mask(block_mask, q, k)
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale: expected a finite float or None, got {scale!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0 and math.isfinite(softcap)):
        raise ValueError(f"softcap: expected a positive finite float or None, got {softcap!r}")


def _check_mask(block_mask, q, k) -> None:
    if not isinstance(block_mask, OmniBlockMask):
        raise TypeError(f"block_mask: expected an OmniBlockMask (OmniBlockMask.from_dense builds one from a bool "
                        f"mask), got {type(block_mask).__name__}")
    batch, heads_q, q_len, _ = q.shape
    kv_len = k.shape[2]
    if (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
        raise ValueError(f"block_mask: expected q_len={q_len}, kv_len={kv_len} (from q and k), got "
                         f"q_len={block_mask.q_len}, kv_len={block_mask.kv_len}")
    if block_mask.batch not in (1, batch):
        raise ValueError(f"block_mask: expected batch 1 or {batch}, got {block_mask.batch}")
    if block_mask.heads not in (1, heads_q):
        raise ValueError(f"block_mask: expected heads 1 or Hq={heads_q}, got {block_mask.heads}")
    if block_mask.doc_ids is not None and block_mask.doc_ids.shape[0] not in (1, batch):
        raise ValueError(f"block_mask.doc_ids: expected batch 1 or {batch}, got {block_mask.doc_ids.shape[0]}")
    if block_mask.device != q.device:
        raise ValueError(f"block_mask: expected device {q.device} (that of q), got {block_mask.device}; "
                         f"use block_mask.to(q.device)")
