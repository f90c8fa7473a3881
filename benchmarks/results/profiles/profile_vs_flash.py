"""One forward + backward of omni and one of Flex's FLASH backend (FlashAttention-4's kernels) on a suite layout,
so that Nsight Compute can profile the two side by side. Each runs three times to warm up (compile), then once
inside an NVTX range of its name; the backward runs on autograd's own thread, outside that range, so pick the
backward's kernels by name and skip the warm-up launches:

    ncu --nvtx --nvtx-include "omni/" --nvtx-include "flash/" --set full -o fwd \\
        python benchmarks/results/profiles/profile_vs_flash.py causal 8192
    ncu --kernel-name regex:"bwd_kernel|BackwardSm90" --launch-skip 3 --launch-count 1 --set full -o bwd \\
        python benchmarks/results/profiles/profile_vs_flash.py causal 8192 --impl omni    # (and --impl flash)

The suite's realistic shape (B 1, 32 query / 8 KV heads, bf16). Needs a GPU and `flash_attn.cute`
(`benchmarks/flash_setup.sh`) for the FLASH call.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from benchmarks import layouts
from omni_hf import omni_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mask", choices=layouts.MASKS)
    parser.add_argument("seq_len", type=int)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--impl", choices=("omni", "flash", "both"), default="both")
    args = parser.parse_args()

    layout = layouts.build(args.mask, args.seq_len)
    shape = (1, 32, args.seq_len, args.head_dim)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn((1, 8, args.seq_len, args.head_dim), generator=gen, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    dout = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    omni_mask = layout.omni_mask(128, "cuda")
    block_mask = create_block_mask(layout.mask_mod("cuda"), None, None, args.seq_len, args.seq_len, device="cuda")
    flash = torch.compile(flex_attention, dynamic=False)
    calls = {
        "omni": lambda: omni_attention(q, k, v, omni_mask),
        "flash": lambda: flash(q, k, v, block_mask=block_mask, enable_gqa=True, kernel_options={"BACKEND": "FLASH"}),
    }
    for name, call in calls.items():
        if args.impl not in (name, "both"):
            continue
        for _ in range(3):
            torch.autograd.grad(call(), (q, k, v), dout)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(name)
        torch.autograd.grad(call(), (q, k, v), dout)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print(f"{name}: profiled one forward + backward ({args.mask}, S {args.seq_len}, D {args.head_dim})")


if __name__ == "__main__":
    main()
