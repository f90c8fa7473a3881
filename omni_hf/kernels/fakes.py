"""The library's ops as ``torch.compile`` sees them: shapes, dtypes and strides of their outputs (fake
implementations, registered once the library defines the ops), and the output layout they share with
``output_strides`` in csrc/host/torch_ops.cpp."""

from __future__ import annotations

import torch

__all__ = ["output_strides", "register_fakes"]


def output_strides(t: torch.Tensor) -> tuple[int, ...]:
    """Strides of the op's output for input ``t`` ``[B, H, S, D]``: ``[B, S, H, D]`` order when ``t`` is that
    layout transposed (``t.stride(1) == D`` and ``t.stride(2) == H * D``, as Transformers hands q), else
    contiguous. Mirrors ``output_strides`` in csrc/host/torch_ops.cpp."""
    batch, heads, seq, dim = t.shape
    if t.stride(1) == dim and t.stride(2) == heads * dim and t.stride(3) == 1:
        return seq * heads * dim, dim, heads * dim, 1
    return heads * seq * dim, seq * dim, dim, 1


def _like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty_strided(t.shape, output_strides(t))


def register_fakes() -> None:
    """Registers the fake implementations of ``omni_hf::fwd``, ``omni_hf::bwd`` and ``omni_hf::token_mask``.
    ``omni_hf::bwd`` adds bias's gradient into ``dbias`` (``Tensor(a!)?``, mutated in place), so it returns nothing
    more."""

    @torch.library.register_fake("omni_hf::fwd")
    def _(q, k, v, num, indices, types, partial, pool, doc, grp, ranges, kind, block_q, block_kv, window,
          window_covers_groups, scale, softcap, sinks, bias=None):
        return _like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)

    @torch.library.register_fake("omni_hf::bwd")
    def _(dout, q, k, v, out, lse, num, indices, types, partial, pool, doc, grp, ranges, kind, block_q, block_kv,
          window, window_covers_groups, scale, softcap, bias=None, dbias=None, sinks=None, dsinks=None,
          deterministic=False, row_num=None, row_indices=None, row_types=None, row_partial=None):
        return _like(q), _like(k), _like(v)

    @torch.library.register_fake("omni_hf::token_mask")
    def _(doc, grp, q_len, block_q, block_kv, window, window_covers_groups):
        batch, kv_len = doc.shape
        num_q, num_kv = -(-q_len // block_q), -(-kv_len // block_kv)

        def lists(rows, cols):
            shape = (batch, 1, rows, cols)
            return [doc.new_empty(shape[:3]), doc.new_empty(shape), doc.new_empty(shape, dtype=torch.int8),
                    doc.new_empty(shape)]

        return (*lists(num_q, num_kv), *lists(num_kv, num_q), doc.new_empty((batch, kv_len, 4)))
