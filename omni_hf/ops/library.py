"""The CUDA library's attention ops on torch tensors: which calls its kernels take, and the ops that run them.

The library (`omni_hf.kernels`: found, built and loaded there) registers ``omni_hf::fwd`` and ``omni_hf::bwd`` with
PyTorch, so a call is one dispatch, graph capture works, and one binary serves every torch from 2.10 on. This module
takes flat tensors and ints only (a mask as `omni_hf.mask.OmniBlockMask.as_tuple` gives it), never the mask class:

- `available()`: a CUDA device is present and the library loads (never raises);
- `unsupported_reason(q, mask_sizes)`: None when the kernels can run such a call, else a short reason;
- `forward(q, k, v, mask_tensors, mask_sizes, scale, softcap, sinks=None, bias=None) -> (out, lse)`;
- `backward(dout, q, k, v, out, lse, mask_tensors, mask_sizes, scale, softcap, bias=None, dbias=None)
  -> (dq, dk, dv)`, adding bias's gradient into ``dbias`` where given.

Outputs follow their input's memory layout: where q is a transposed ``[B, S, H, D]`` tensor (what Transformers
hands over), out and dq are too, so transposing them back costs no copy (`output_strides`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..kernels import devices
from ..kernels.fakes import output_strides
from ..kernels.loader import available, load_error, set_poison_outputs
from ..kernels.table import BLOCK_SIZES, HEAD_DIMS, MAX_GRID_YZ

__all__ = ["HEAD_DIMS", "available", "backward", "forward", "kernel_head_dim", "output_strides",
           "set_poison_outputs", "unsupported_reason"]

# Parts of a mask's flat tensors (`OmniBlockMask.as_tuple`): the row view, the column view, then the pattern pool,
# doc ids, group ids and token ranges.
ROW_VIEW, COLUMN_VIEW, SHARED = slice(0, 4), slice(4, 8), slice(8, 12)
_DTYPES = (torch.float16, torch.bfloat16)


# ---------------------------------------------------------------------- what the kernels take


_REASONS: dict[tuple, str | None] = {}


@torch.compiler.assume_constant_result  # Dynamo calls it while tracing, rather than tracing into the library load
def _call_reason(device_index: int, dtype: torch.dtype, head_dim: int, block_q: int, block_kv: int) -> str | None:
    """Why the kernels cannot run such a call, or None; answered once per distinct call (a dict, not lru_cache,
    which Dynamo would unwrap and trace)."""
    key = device_index, dtype, head_dim, block_q, block_kv
    if key not in _REASONS:
        _REASONS[key] = _reason(*key)
    return _REASONS[key]


def _reason(device_index: int, dtype: torch.dtype, head_dim: int, block_q: int, block_kv: int) -> str | None:
    if dtype not in _DTYPES:
        return f"dtype {dtype} (kernels take float16 and bfloat16)"
    if kernel_head_dim(head_dim) is None:
        return f"head dim {head_dim} (kernels take head dims up to {HEAD_DIMS[-1]})"
    if block_q not in BLOCK_SIZES or block_kv not in BLOCK_SIZES:
        return f"block sizes {block_q}x{block_kv} (kernels take {' and '.join(map(str, BLOCK_SIZES))})"
    reason = devices.capability_reason(torch.cuda.get_device_capability(device_index))
    if reason is None:
        reason = devices.smem_reason(device_index, kernel_head_dim(head_dim), block_q, block_kv)
    return reason or load_error()


def kernel_head_dim(head_dim: int) -> int | None:
    """The instantiated head dim whose kernels run calls of ``head_dim``: itself, or the next larger one, whose loads
    read the columns past ``head_dim`` as zeros (every score and output stays exact) and whose stores skip them;
    None above the largest."""
    return next((d for d in HEAD_DIMS if d >= head_dim), None)


def unsupported_reason(q: torch.Tensor, mask_sizes: Sequence[int]) -> str | None:
    """None when the CUDA kernels can run attention of ``q`` (checked against k and v by the caller) with a mask of
    ``mask_sizes`` (`OmniBlockMask.as_tuple`'s), else a short human reason. Any strides are accepted: the op copies
    what its loads cannot read."""
    q_len, _, block_q, block_kv, *_ = mask_sizes
    if not q.is_cuda:
        return "tensors not on a CUDA device"
    if -(-q_len // block_q) > MAX_GRID_YZ or q.shape[0] > MAX_GRID_YZ:
        return "too many query blocks or batch rows for one launch"
    return _call_reason(q.get_device(), q.dtype, q.shape[-1], block_q, block_kv)


# ---------------------------------------------------------------------- the ops


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_tensors: Sequence[torch.Tensor | None],
            mask_sizes: Sequence[int], scale: float, softcap: float | None,
            sinks: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward on the GPU (``omni_hf::fwd``).

    Args:
        q: ``[B, Hq, Sq, D]``; k, v: ``[B, Hkv, Skv, D]``; fp16 / bf16, any strides.
        mask_tensors, mask_sizes: the mask as `OmniBlockMask.as_tuple` flattens it, on q's device (or implicit).
        scale: multiplies q.k; softcap: None or 0 for none, else > 0.
        sinks: None, or float32 ``[Hq]`` contiguous on q's device: each query head's sink logit, which joins every
            row's softmax denominator and takes no value.
        bias: None, or float32 / float16 / bfloat16 broadcastable to ``[B, Hq, Sq, Skv]`` on q's device, any
            strides: added to the scores where the mask allows (softcap must be 0). The op takes it expanded to
            exactly ``[B, Hq, Sq, Skv]`` (a view: broadcast dims get stride 0, nothing is copied).
    Returns:
        out ``[B, Hq, Sq, D]`` in q's dtype and layout (`output_strides`) and lse float32 ``[B, Hq, Sq]``
        (the sink included; -inf on empty rows without a sink).
    """
    num, indices, types, partial = mask_tensors[ROW_VIEW]
    pool, doc, grp, ranges = mask_tensors[SHARED]
    _, _, block_q, block_kv, window, window_covers_groups, kind = mask_sizes
    return torch.ops.omni_hf.fwd.default(q, k, v, num, indices, types, partial, pool, doc, grp, ranges, kind,
                                         block_q, block_kv, window, bool(window_covers_groups), scale, softcap or 0.0,
                                         sinks, _expanded(bias, q, k))


def backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, mask_tensors: Sequence[torch.Tensor | None], mask_sizes: Sequence[int], scale: float,
             softcap: float | None, bias: torch.Tensor | None = None, dbias: torch.Tensor | None = None,
             sinks: torch.Tensor | None = None, dsinks: torch.Tensor | None = None,
             deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward on the GPU (``omni_hf::bwd``) from the forward's out and lse; the mask, scalars and
    ``bias`` as in `forward`.

    Args:
        dbias: None, or a zeroed tensor of bias's own (un-expanded) shape, contiguous, on q's device, into which
            the op writes bias's gradient (the gradient of the logits, dL/ds, where the mask allows). The op takes it
            expanded to ``[B, Hq, Sq, Skv]``: where that view gives every (q, k) pair of the call its own element it
            stores each in dbias's dtype (float32, float16 or bfloat16), else it adds them with float32 atomics (dbias
            must then be float32), which sum over the dims where bias broadcasts. Needs ``bias``.
        sinks, dsinks: None, or float32 ``[Hq]`` contiguous on q's device: the forward's sinks and a zeroed tensor into
            which the op adds their gradient, ``-sum over b and rows of exp(sinks[h] - lse) * rowsum(dout * out)``
            (computed beside that row sum, which the backward needs anyway).
        deterministic: gradients bitwise equal on every run: the kernels add each Q tile's dQ in a fixed order of key
            tiles (counted in the mask's row view, which the op then also takes). ``dsinks`` must then be None and
            ``dbias`` give every pair its own element (the op would add those with atomics).
    Returns:
        dq ``[B, Hq, Sq, D]``, dk and dv ``[B, Hkv, Skv, D]``, each in its input's dtype and layout.
    """
    num, indices, types, partial = mask_tensors[COLUMN_VIEW]
    pool, doc, grp, ranges = mask_tensors[SHARED]
    _, _, block_q, block_kv, window, window_covers_groups, kind = mask_sizes
    return torch.ops.omni_hf.bwd.default(dout, q, k, v, out, lse, num, indices, types, partial, pool, doc, grp, ranges,
                                         kind, block_q, block_kv, window, bool(window_covers_groups), scale,
                                         softcap or 0.0, _expanded(bias, q, k), _expanded(dbias, q, k), sinks, dsinks,
                                         deterministic, *(mask_tensors[ROW_VIEW] if deterministic else (None,) * 4))


def _expanded(t: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """``t`` (broadcastable to ``[B, Hq, Sq, Skv]``) as a view of exactly that shape, or None."""
    if t is None:
        return None
    batch, heads_q, q_len, _ = q.shape
    return t.expand(batch, heads_q, q_len, k.shape[2])
