"""`omni_attention`: input checks, backend dispatch and autograd.

Two backends run a call: the CUDA library's ops (``omni_hf::fwd`` / ``omni_hf::bwd``, registered in C++ with
fake implementations, `omni_hf.ops.library`) where they can run it, otherwise the exact PyTorch reference (wrapped in
the custom ops ``omni_hf::reference_forward`` / ``omni_hf::reference_backward`` for ``torch.compile``, called directly
in eager mode). ``OMNI_HF_BACKEND=cuda|reference`` forces one. One `torch.autograd.Function` ties forward and
backward together, so ``torch.compile(fullgraph=True)`` traces a training step without a graph break; a call
that needs no gradient skips it. The per-call path is kept short: host time matters at small sizes. A call is
prepared (`prepare_call`: checks, backend, the mask flattened) and then run (`run_call`); Transformers' layers
reuse one prepared call per forward (`omni_hf.integrations.transformers.attention`).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import NamedTuple, Optional

import torch

from ..kernels.table import HEAD_DIMS
from ..mask import OmniBlockMask
from . import library, reference

__all__ = ["omni_attention"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BIAS_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = HEAD_DIMS[-1]  # the largest head dim the op takes, on every backend


def omni_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: OmniBlockMask,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` over ``k``, ``v`` where ``block_mask`` allows.

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Skv, D]`` with ``Hq % Hkv == 0`` (GQA / MQA, no copy).
            fp16 / bf16 (float32 runs on the reference); any strides with the last dim contiguous;
            ``D`` a multiple of 8, at most 512 (the CUDA kernels are instantiated for some head dims,
            `omni_hf.ops.library.HEAD_DIMS`; any other runs on the next larger one, whose loads read the missing
            columns as zeros and whose stores skip them: exact, with no copy).
        block_mask: an `OmniBlockMask` with ``q_len == Sq``, ``kv_len == Skv``, batch 1 or B, heads 1 or Hq,
            on q's device (implicit masks, `OmniBlockMask.causal` and `OmniBlockMask.full`, serve any device).
        scale: multiplies ``q.k`` (default ``D ** -0.5``).
        softcap: if set, scores become ``softcap * tanh(score / softcap)``.
        sinks: ``[Hq]`` learnable sink logits (gpt-oss's ``s_aux``), float32 or q's dtype, on q's device: each joins
            its head's softmax denominators as ``exp(sink)`` and takes no value; differentiable. A row with no
            allowed key then outputs 0 with LSE = its sink.
        bias: an additive score bias (T5's ``position_bias``), broadcastable to ``[B, Hq, Sq, Skv]`` (as
            ``[1, Hq, Sq, Skv]``, ``[B, 1, Sq, Skv]``, ``[Hq, Sq, Skv]``, ``[Sq, Skv]``), float32, float16 or
            bfloat16 whatever q's dtype, on q's device, any strides (never copied: T5's permuted view is read as
            it is). The logits become ``scale * q.k + bias[b, h, i, j]`` where the mask allows ``(i, j)``, -inf
            elsewhere: masked pairs never read bias and get zero gradient. Differentiable: its gradient is the
            gradient of the logits summed over the dims where bias broadcasts, in bias's dtype and shape. Cannot be
            combined with ``softcap`` (ValueError).
        deterministic: gradients bitwise equal on every run (also on whenever
            ``torch.use_deterministic_algorithms(True)`` is). The kernels then add each Q tile's dQ in a fixed order
            of key tiles, and the sinks' gradient and a broadcast bias's are summed by PyTorch instead of atomics
            (the bias's through a float32 buffer of the call's ``[B, Hq, Sq, Skv]``). The forward is deterministic
            either way, and so is the reference (``OMNI_HF_BACKEND=reference``).
        return_lse: also return the log-sum-exp of each row (the sink included).

    Under autocast, q, k and v are cast to the autocast dtype first, as SDPA does.

    Returns:
        out ``[B, Hq, Sq, D]`` in q's dtype (on the GPU in q's memory layout, so a transposed ``[B, Sq, Hq, D]``
        q gives an out whose transpose is contiguous); with ``return_lse``, also lse float32 ``[B, Hq, Sq]``
        (natural log, -inf for rows with no allowed key, whose output is 0). lse is not differentiable.
    """
    q, k, v = cast_for_autocast(q, k, v)
    out, lse = run_call(prepare_call(q, k, v, block_mask, scale, softcap), q, k, v, sinks, bias, deterministic)
    return (out, lse) if return_lse else out


class PreparedCall(NamedTuple):
    """What `prepare_call` resolves of a call, so that `run_call` runs it on any q, k, v of the same device, dtype
    and shapes (Transformers' layers of one forward reuse it).

    Attributes:
        backend: "cuda" (the library's ops) or "reference".
        mask_tensors, mask_sizes: the mask flattened (`OmniBlockMask.as_tuple`).
        scale: float; softcap: float, 0.0 for none.
    """

    backend: str
    mask_tensors: tuple[torch.Tensor | None, ...]
    mask_sizes: tuple[int, ...]
    scale: float
    softcap: float


def cast_for_autocast(q, k, v) -> tuple:
    """q, k and v in the autocast dtype where autocast is on for q's device (as SDPA: RoPE hands float32 q and k,
    the linear a bf16 v), else as given."""
    if isinstance(q, torch.Tensor) and torch.is_autocast_enabled("cuda" if q.is_cuda else q.device.type):
        tensors = (q, k, v)
        if all(isinstance(t, torch.Tensor) for t in tensors):
            dtype = torch.get_autocast_dtype(q.device.type)
            return tuple(t.to(dtype) for t in tensors)
    return q, k, v


def prepare_call(q, k, v, block_mask, scale=None, softcap=None) -> PreparedCall:
    """`omni_attention`'s checks and backend choice, and the mask flattened for it (arguments as there); raises
    TypeError / ValueError naming the argument."""
    if not _mask_and_scalars_fit(q, k, block_mask, scale, softcap):
        _explain_inputs(q, k, v, block_mask, scale, softcap)
    tensors, sizes = block_mask.as_tuple()
    backend = _checked_backend(q, k, v, block_mask, sizes, scale, softcap)
    return PreparedCall(backend, tensors, sizes, q.shape[-1] ** -0.5 if scale is None else float(scale),
                        float(softcap or 0.0))


def run_call(call: PreparedCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             sinks: torch.Tensor | None = None, bias: torch.Tensor | None = None,
             deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a prepared call (`omni_attention`'s outputs), through autograd where a gradient is needed. Where
    the CUDA op refuses the tensors, the error names the argument at fault, where Python can tell. ``sinks`` and
    ``bias`` are not part of the prepared call (each layer has its own): checked here. ``deterministic`` as in
    `omni_attention`."""
    if sinks is not None:
        _check_sinks(sinks, q)
    if bias is not None:
        _check_bias(bias, q, k, call.softcap)
    try:
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
                sinks is not None and sinks.requires_grad) or (bias is not None and bias.requires_grad)):
            return _Attention.apply(q, k, v, sinks, bias, deterministic, *call)
        return _forward(q, k, v, sinks, bias, *call)
    except RuntimeError:
        if call.backend == _CUDA:
            _explain_inputs(q, k, v, OmniBlockMask.from_tuple(call.mask_tensors, call.mask_sizes), call.scale,
                            call.softcap or None)
        raise


def forward_call(call: PreparedCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a prepared call outside autograd, for callers that run their own backward
    (`backward_call`): context parallelism merges the calls of several key blocks by their LSE."""
    return _forward(q, k, v, None, None, *call)


def backward_call(call: PreparedCall, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of a prepared call given ``out`` ``[B, Hq, Sq, D]`` and float32 ``lse`` ``[B, Hq, Sq]``. They may
    be those of a larger softmax that this call's keys are part of (the merged output and LSE of several key blocks):
    the gradients are then this block's share of that softmax's, exactly (FlashAttention's backward). Deterministic
    under ``torch.use_deterministic_algorithms(True)``."""
    dq, dk, dv, _, _ = _backward(call.backend, dout, q, k, v, out, lse, None, False, None, False, call.mask_tensors,
                                 call.mask_sizes, call.scale, call.softcap, False)
    return dq, dk, dv


# ---------------------------------------------------------------------- backends

_CUDA, _REFERENCE = "cuda", "reference"


def _forward(q, k, v, sinks, bias, backend: str, mask_tensors, mask_sizes, scale: float, softcap: float):
    """(out, lse) of ``backend`` for the mask flattened by `OmniBlockMask.as_tuple`; the reference runs as its
    custom op while compiling (opaque to Dynamo)."""
    if backend == _CUDA:
        kernel_sinks = None if sinks is None else sinks.detach().float().contiguous()
        return library.forward(q, k, v, mask_tensors, mask_sizes, scale, softcap, kernel_sinks, bias)
    if torch.compiler.is_compiling():
        return reference_forward_op(q, k, v, mask_tensors, mask_sizes, scale, softcap, sinks, bias)
    return reference.attention_forward(q, k, v, OmniBlockMask.from_tuple(mask_tensors, mask_sizes), scale,
                                       softcap or None, sinks, bias)


def _backward(backend: str, dout, q, k, v, out, lse, sinks, sinks_grad: bool, bias, bias_grad: bool, mask_tensors,
              mask_sizes, scale: float, softcap: float, deterministic: bool):
    """(dq, dk, dv, dsinks, dbias) of ``backend`` from the forward's out and lse. dsinks (where ``sinks_grad``, else
    None) is float32 ``[Hq]``: the CUDA op computes it beside the row sums its backward needs anyway, the reference
    (and a deterministic CUDA backward) by `reference.sink_gradient`. dbias (where ``bias_grad``, else None) has
    bias's own shape, in bias's dtype where the CUDA op stores each element once, else float32; the backward writes
    the gradient of the logits into it, summed over the dims where bias broadcasts (by PyTorch from a buffer of the
    call's shape where ``deterministic``, or under ``torch.use_deterministic_algorithms(True)``)."""
    if backend == _CUDA:
        return _cuda_backward(dout, q, k, v, out, lse, sinks if sinks_grad else None, bias, bias_grad, mask_tensors,
                              mask_sizes, scale, softcap,
                              deterministic or torch.are_deterministic_algorithms_enabled())
    dbias = torch.zeros(bias.shape, dtype=torch.float32, device=q.device) if bias_grad else None
    if torch.compiler.is_compiling():
        grads = reference_backward_op(dout, q, k, v, out, lse, mask_tensors, mask_sizes, scale, softcap, bias, dbias)
    else:
        grads = reference.attention_backward(dout, q, k, v, out, lse,
                                             OmniBlockMask.from_tuple(mask_tensors, mask_sizes), scale,
                                             softcap or None, bias, dbias)
    dsinks = reference.sink_gradient(dout, out, lse, sinks) if sinks_grad else None
    return (*grads, dsinks, dbias)


def _cuda_backward(dout, q, k, v, out, lse, sinks, bias, bias_grad: bool, mask_tensors, mask_sizes, scale: float,
                   softcap: float, deterministic: bool):
    """`_backward` on the library's op. What the kernels would add with atomics (the sinks' gradient, a broadcast
    bias's) is left to PyTorch where ``deterministic``."""
    exclusive = _bias_exclusive(bias, q, k) if bias_grad else True
    dbias = None
    if bias_grad:
        shape = (*q.shape[:3], k.shape[2]) if deterministic and not exclusive else bias.shape
        dbias = torch.zeros(shape, dtype=bias.dtype if exclusive else torch.float32, device=q.device)
    dsinks = None
    if sinks is not None and not deterministic:
        dsinks = torch.zeros(q.shape[1], dtype=torch.float32, device=q.device)
    kernel_sinks = None if dsinks is None else sinks.detach().float().contiguous()
    grads = library.backward(dout, q, k, v, out, lse, mask_tensors, mask_sizes, scale, softcap, bias, dbias,
                             kernel_sinks, dsinks, deterministic)
    if sinks is not None and deterministic:
        dsinks = reference.sink_gradient(dout, out, lse, sinks)
    if dbias is not None and dbias.shape != bias.shape:
        dbias = reference.summed_to_broadcast(dbias, bias.shape).reshape(bias.shape)
    return (*grads, dsinks, dbias)


def _bias_exclusive(bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether every (q, k) pair of the call has its own element of ``bias`` (no dim of the call longer than 1 on
    which bias broadcasts): the CUDA op then stores its gradient in bias's dtype, else adds it into float32."""
    call = (*q.shape[:3], k.shape[2])
    shape = (1,) * (4 - bias.dim()) + tuple(bias.shape)
    return all(size == extent or extent == 1 for size, extent in zip(shape, call))


class _Attention(torch.autograd.Function):
    """Autograd of `omni_attention`: ``forward(q, k, v, sinks, bias, deterministic, backend, mask_tensors, mask_sizes,
    scale, softcap) -> (out, lse)``; lse is not differentiable; sinks (or None) and bias (or None) get the backend's
    dsinks and dbias, in bias's dtype, allocated only where bias needs it. The mask travels flattened
    (`OmniBlockMask.as_tuple`) so that Dynamo sees only tensors and constants; its tensors never need a gradient, so
    they ride on ctx rather than through save_for_backward, which keeps the call's argument count (and its host
    cost) small."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, bias, deterministic, backend, mask_tensors, mask_sizes, scale, softcap):
        out, lse = _forward(q, k, v, sinks, bias, backend, mask_tensors, mask_sizes, scale, softcap)
        ctx.save_for_backward(q, k, v, out, lse, sinks, bias)
        ctx.args = backend, mask_tensors, mask_sizes, scale, softcap, deterministic
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zeros for lse's gradient
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, sinks, bias = ctx.saved_tensors
        backend, tensors, sizes, scale, softcap, deterministic = ctx.args
        if grad_out is None:
            return (None,) * 11
        sinks_grad = sinks is not None and ctx.needs_input_grad[3]
        bias_grad = bias is not None and ctx.needs_input_grad[4]
        dq, dk, dv, dsinks, dbias = _backward(backend, grad_out, q, k, v, out, lse, sinks, sinks_grad, bias, bias_grad,
                                              tensors, sizes, scale, softcap, deterministic)
        if dsinks is not None:
            dsinks = dsinks.to(sinks.dtype)
        if dbias is not None:
            dbias = dbias.to(bias.dtype)
        return dq, dk, dv, dsinks, dbias, None, None, None, None, None, None


@torch.library.custom_op("omni_hf::reference_forward", mutates_args=())
def reference_forward_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_tensors: list[Optional[torch.Tensor]],
    mask_sizes: list[int], scale: float, softcap: float, sinks: Optional[torch.Tensor], bias: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference forward as one op (for compiled graphs): out ``[B, Hq, Sq, D]``, lse float32 ``[B, Hq, Sq]``."""
    mask = OmniBlockMask.from_tuple(mask_tensors, mask_sizes)
    return reference.attention_forward(q, k, v, mask, scale, softcap or None, sinks, bias)


@reference_forward_op.register_fake
def _(q, k, v, mask_tensors, mask_sizes, scale, softcap, sinks, bias):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("omni_hf::reference_backward", mutates_args=("dbias",))
def reference_backward_op(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    mask_tensors: list[Optional[torch.Tensor]], mask_sizes: list[int], scale: float, softcap: float,
    bias: Optional[torch.Tensor], dbias: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference backward as one op: dq, dk, dv shaped like q, k, v (contiguous); adds bias's gradient into
    ``dbias`` (float32, bias's shape) where given, as ``omni_hf::bwd`` does."""
    mask = OmniBlockMask.from_tuple(mask_tensors, mask_sizes)
    return reference.attention_backward(dout, q, k, v, out, lse, mask, scale, softcap or None, bias, dbias)


@reference_backward_op.register_fake
def _(dout, q, k, v, out, lse, mask_tensors, mask_sizes, scale, softcap, bias, dbias):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---------------------------------------------------------------------- dispatch


_warned_fallback = False


def _checked_backend(q, k, v, block_mask, mask_sizes: tuple[int, ...], scale, softcap) -> str:
    """"cuda" where the library's kernels can run the call (its op checks the tensors), else "reference" once the
    tensors are checked too (`_tensors_fit`: the reference takes any tensors). The mask and scalars are checked before
    (`prepare_call`)."""
    choice = os.environ.get("OMNI_HF_BACKEND", "auto")
    if choice not in ("auto", "cuda", "reference"):
        raise ValueError(f"OMNI_HF_BACKEND: expected 'cuda', 'reference' or unset, got {choice!r}")
    reason = "OMNI_HF_BACKEND=reference" if choice == "reference" else library.unsupported_reason(q, mask_sizes)
    if reason is None:
        return _CUDA
    if not _tensors_fit(q, k, v, block_mask):
        _explain_inputs(q, k, v, block_mask, scale, softcap)
    if choice == "cuda":
        raise RuntimeError(f"OMNI_HF_BACKEND=cuda, but the CUDA kernels cannot run these inputs: {reason}")
    global _warned_fallback
    if choice == "auto" and q.is_cuda and not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"omni_attention: running the PyTorch reference on the GPU ({reason}); it is about 100x "
                      f"slower than the CUDA kernels, which take float16 / bfloat16 and head dims up to "
                      f"{library.HEAD_DIMS[-1]}", stacklevel=3)
    return _REFERENCE


# ---------------------------------------------------------------------- checks


def _mask_and_scalars_fit(q, k, block_mask, scale, softcap) -> bool:
    """The checks the CUDA ops leave to Python: the mask, its lengths against q's and k's, the scale and softcap."""
    try:
        return (type(block_mask) is OmniBlockMask and block_mask.q_len == q.shape[2] and block_mask.kv_len == k.shape[2]
                and (scale is None or (type(scale) in (int, float) and 0 < scale < math.inf))
                and (softcap is None or (type(softcap) in (int, float) and 0 < softcap < math.inf)))
    except (AttributeError, TypeError, IndexError):
        return False


def _tensors_fit(q, k, v, block_mask: OmniBlockMask) -> bool:
    """Whether q, k and v agree (shapes, dtypes, device, a contiguous last dim) and the mask's block lists and token
    ids broadcast over q's batch and heads on q's device (the mask's kind and lengths: `_mask_and_scalars_fit`)."""
    try:
        qs, ks, device, dtype = q.shape, k.shape, q.device, q.dtype
        return (len(qs) == 4 and len(ks) == 4 and ks == v.shape and ks[0] == qs[0] and ks[3] == qs[3]
                and qs[1] % ks[1] == 0 and qs[3] % 8 == 0 and qs[3] <= MAX_HEAD_DIM
                and dtype in SUPPORTED_DTYPES and k.dtype is dtype and v.dtype is dtype
                and k.device == device and v.device == device
                and q.stride()[3] == 1 and k.stride()[3] == 1 and v.stride()[3] == 1
                and (block_mask.implicit or _block_lists_fit(block_mask, qs, device)))
    except (AttributeError, TypeError, IndexError):
        return False


def _block_lists_fit(block_mask: OmniBlockMask, q_shape: torch.Size, device: torch.device) -> bool:
    """Whether a mask's block lists (and token ids) broadcast over q's batch and heads on q's device."""
    num_blocks, rule = block_mask.kv.num_blocks, block_mask.token_rule
    return (num_blocks.shape[0] in (1, q_shape[0]) and num_blocks.shape[1] in (1, q_shape[1])
            and num_blocks.device == device and (rule is None or rule.doc_ids.shape[0] in (1, q_shape[0])))


def _explain_inputs(q, k, v, block_mask, scale, softcap) -> None:
    """Raise TypeError / ValueError for the first problem with the inputs, naming the argument, what was expected and
    what was received (the checks that found one: `_mask_and_scalars_fit`, `_tensors_fit`, or the CUDA op's)."""
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
    if isinstance(block_mask, OmniBlockMask) and _looks_like_bshd(q, k, block_mask):
        raise ValueError(f"q: expected [B, H, S, D], got shape {tuple(q.shape)}, which looks like [B, S, H, D] (dim 1 "
                         f"is the mask's q_len={block_mask.q_len}); pass q.transpose(1, 2), and k and v likewise")
    batch, heads_q, q_len, dim = q.shape
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[0] != batch or k.shape[3] != dim:
        raise ValueError(f"k: expected shape [{batch}, Hkv, Skv, {dim}] (batch and head dim of q), "
                         f"got {tuple(k.shape)}")
    if heads_q % k.shape[1] != 0:
        raise ValueError(f"k: expected a head count dividing Hq={heads_q}, got {k.shape[1]}")
    if dim % 8 != 0 or dim > MAX_HEAD_DIM:
        raise ValueError(f"q: expected a head dim that is a multiple of 8 and at most {MAX_HEAD_DIM}, got {dim}")
    _check_mask(block_mask, q, k)
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale: expected a positive finite float or None, got {scale!r}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0 and math.isfinite(softcap)):
        raise ValueError(f"softcap: expected a positive finite float or None, got {softcap!r}")


def _check_sinks(sinks, q: torch.Tensor) -> None:
    """sinks: a floating ``[Hq]`` tensor on q's device, float32 or q's dtype."""
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks: expected a torch.Tensor [Hq] or None, got {type(sinks).__name__}")
    if sinks.shape != (q.shape[1],):
        raise ValueError(f"sinks: expected shape [Hq] = [{q.shape[1]}] (one logit per query head), got "
                         f"{tuple(sinks.shape)}")
    if sinks.dtype not in (torch.float32, q.dtype) or not sinks.is_floating_point():
        raise TypeError(f"sinks: expected dtype torch.float32 or q's {q.dtype}, got {sinks.dtype}")
    if sinks.device != q.device:
        raise ValueError(f"sinks: expected device {q.device} (that of q), got {sinks.device}")


def _check_bias(bias, q: torch.Tensor, k: torch.Tensor, softcap: float) -> None:
    """bias: a float32 / float16 / bfloat16 tensor broadcastable to ``[B, Hq, Sq, Skv]`` on q's device, in a call
    without softcap."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias: expected a torch.Tensor broadcastable to [B, Hq, Sq, Skv] or None, got "
                        f"{type(bias).__name__}")
    target = (*q.shape[:3], k.shape[2])
    if bias.dim() > 4 or any(size not in (1, full) for size, full in zip(reversed(bias.shape), reversed(target))):
        raise ValueError(f"bias: expected a shape broadcastable to [B, Hq, Sq, Skv] = {list(target)} (at most 4 dims, "
                         f"each 1 or that size), got {tuple(bias.shape)}")
    if bias.dtype not in BIAS_DTYPES:
        raise TypeError(f"bias: expected dtype torch.float32, torch.float16 or torch.bfloat16, got {bias.dtype}")
    if bias.device != q.device:
        raise ValueError(f"bias: expected device {q.device} (that of q), got {bias.device}")
    if softcap:
        raise ValueError(f"bias: softcap and bias cannot be combined: expected softcap=None with a bias, got "
                         f"softcap={softcap}")


def _looks_like_bshd(q: torch.Tensor, k: torch.Tensor, block_mask: OmniBlockMask) -> bool:
    """q and k in Transformers' ``[B, S, H, D]`` layout, not transposed: their dim 1, not 2, holds the mask's
    lengths."""
    return (q.shape[2], k.shape[2]) != (block_mask.q_len, block_mask.kv_len) and (
        q.shape[1], k.shape[1]) == (block_mask.q_len, block_mask.kv_len)


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
        raise ValueError(f"block_mask: expected batch {_batches(batch)}, got {block_mask.batch}")
    if block_mask.heads not in (1, heads_q):
        raise ValueError(f"block_mask: expected heads 1 or Hq={heads_q}, got {block_mask.heads}")
    ids = None if block_mask.token_rule is None else block_mask.token_rule.doc_ids
    if ids is not None and ids.shape[0] not in (1, batch):
        raise ValueError(f"block_mask.token_rule.doc_ids: expected batch {_batches(batch)}, got {ids.shape[0]}")
    if block_mask.device is not None and block_mask.device != q.device:
        raise ValueError(f"block_mask: expected device {q.device} (that of q), got {block_mask.device}; "
                         f"use block_mask.to(q.device)")


def _batches(batch: int) -> str:
    """The mask batches that fit q's ``batch``, in words (a mask of batch 1 serves every row)."""
    return "1 (q's batch)" if batch == 1 else f"1 or {batch} (q's batch; a mask of batch 1 serves every row)"
