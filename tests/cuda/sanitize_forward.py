"""Small forward cases for compute-sanitizer (not a pytest module): every tile kind, both block sizes, every
instantiated head dim, tails, q_len = 1, broadcast masks, GQA, the decode path. Run on a GPU as

    compute-sanitizer --tool memcheck --kernel-name kns=fwd_kernel python -m tests.cuda.sanitize_forward
    compute-sanitizer --tool racecheck --kernel-name kns=fwd_kernel python -m tests.cuda.sanitize_forward

and expect "ERROR SUMMARY: 0 errors". Head dims given as arguments (any multiple of 8, e.g. 72 for the 96 kernels at
a true width) replace the instantiated ones in the block-list cases. On a Hopper GPU the cases with 128-key blocks
run the sm_90a kernel, in 64-row CTAs (these grids are small) but the last four cases, in persistent 128-row CTAs
and (head dim 64, implicit masks) 192-row ones (`--kernel-name kns=sm90` checks it alone; OMNI_HF_DISABLE_SM90=1
sends every case to the sm_80 kernel). Exits non-zero if an output is not finite.
"""

from __future__ import annotations

import sys

import torch

from omni_hf import OmniBlockMask
from omni_hf.ops import library
from tests.helpers.brute_force import packed_vlm_ids, without_ranges
from tests.helpers.kernel_checks import random_block_dense


def cases(dims):
    """(mask, q_len, kv_len, dim, heads_q, heads_kv, softcap) tuples covering every kernel path, the block-list
    cases at each head dim of `dims`."""
    doc, grp = packed_vlm_ids(2, 333, seed=1, device="cuda")
    for block_q, block_kv in ((64, 64), (128, 128), (64, 128), (128, 64)):
        for dim in dims:
            dense = random_block_dense(1, 2, 200, 333, block_q, block_kv, seed=dim + block_q)
            yield OmniBlockMask.from_dense(dense, block_size=(block_q, block_kv)), 200, 333, dim, 2, 1, None
            yield (OmniBlockMask.from_token_ids(doc, grp, q_len=150, block_size=(block_q, block_kv)),
                   150, 333, dim, 4, 2, 10.0)
    token_rule = OmniBlockMask.from_token_ids(doc, grp, q_len=150)  # ranges; without them the kernels compare ids
    yield without_ranges(token_rule), 150, 333, 128, 4, 2, None
    yield OmniBlockMask.causal(1, 333), 1, 333, 128, 2, 2, None
    # The decode path (at most 16 query rows per KV head): split keys with a merge, a window, softcap, empty rows.
    yield OmniBlockMask.causal(1, 2049), 1, 2049, 128, 8, 2, None
    yield OmniBlockMask.causal(2, 2049), 2, 2049, 96, 8, 2, None
    yield OmniBlockMask.causal(2, 2049), 2, 2049, 80, 8, 2, None  # the 96 kernels at a true width of 80
    yield OmniBlockMask.causal(3, 1031, window=50), 3, 1031, 64, 20, 4, 5.0
    yield OmniBlockMask.full(2, 517), 2, 517, 64, 16, 2, None
    yield OmniBlockMask.causal(4, 2), 4, 2, 128, 4, 1, None
    yield OmniBlockMask.causal(200, 333, window=70), 200, 333, 64, 2, 1, None
    yield OmniBlockMask.full(150, 333), 150, 333, 128, 4, 2, None
    # 160 CTAs of 64 rows at head dim 64: two per SM, all resident, in the folded launch order (fwd_kernel.cuh).
    yield OmniBlockMask.causal(640, 640), 640, 640, 64, 8, 2, None
    # 192 work items of 128 rows (320 CTAs of 64 would not all fit at once on an H100 / H200): persistent CTAs, one
    # per SM, some taking two items (the second one's Q loading during the first one's epilogue).
    short_doc, short_grp = doc[:, :300].contiguous(), grp[:, :300].contiguous()
    yield OmniBlockMask.from_token_ids(short_doc, short_grp), 300, 300, 64, 32, 8, None
    yield OmniBlockMask.from_token_ids(short_doc, short_grp), 300, 300, 128, 32, 8, 10.0
    # 528 work items of 192 rows (four waves on 132 SMs) under implicit masks at head dim 64: persistent CTAs of
    # three consumer warpgroups, queries bottom-right aligned to longer keys, a window.
    yield OmniBlockMask.causal(384, 384), 384, 384, 64, 132, 4, None
    yield OmniBlockMask.causal(384, 600, window=100), 384, 600, 64, 132, 12, None


def main(dims) -> int:
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for mask, q_len, kv_len, dim, heads_q, heads_kv, softcap in cases(dims):
            q = torch.randn(2, heads_q, q_len, dim, generator=g, device="cuda", dtype=dtype)
            k = torch.randn(2, heads_kv, kv_len, dim, generator=g, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            out, lse = library.forward(q, k, v, *mask.as_tuple(), dim ** -0.5, softcap)
            torch.cuda.synchronize()
            if not torch.isfinite(out).all() or torch.isnan(lse).any():
                print(f"non-finite output: {dtype} q_len={q_len} dim={dim} blocks={mask.block_q}x{mask.block_kv}")
                return 1
    print("sanitize_forward: all cases ran")
    return 0


if __name__ == "__main__":
    sys.exit(main([int(arg) for arg in sys.argv[1:]] or library.HEAD_DIMS))  # head dims: the arguments, if any
