"""One forward + backward of omni and of its peers (Flex's FLASH backend, FlashAttention-4's kernels; SDPA's cuDNN
backend on causal masks) on a suite layout, so that Nsight Compute can profile them side by side. Each runs three
times to warm up (compile), then once inside an NVTX range of its name, with the backward on the calling thread
(autograd's multithreading off) so that the range holds the backward's kernels too:

    ncu --nvtx --nvtx-include "omni/" --nvtx-include "flash/" --set full -o fwd_bwd \\
        python benchmarks/results/profiles/profile_vs_flash.py causal 8192
    ncu --nvtx --nvtx-include "omni/" --nvtx-include "cudnn/" --set full -o d64 \\
        python benchmarks/results/profiles/profile_vs_flash.py causal 8192 --head-dim 64 --impl omni cudnn

The suite's realistic shape (B 1, 32 query / 8 KV heads, bf16). Needs a GPU, and `flash_attn.cute`
(`benchmarks/flash_setup.sh`) for the FLASH call.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from benchmarks import layouts
from omni_hf import omni_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mask", choices=layouts.MASKS)
    parser.add_argument("seq_len", type=int)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--impl", nargs="+", choices=("omni", "flash", "cudnn"), default=["omni", "flash"])
    args = parser.parse_args()
    if "cudnn" in args.impl and args.mask != "causal":
        parser.error(f"--impl cudnn: expected the causal mask, got {args.mask!r}")

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

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    calls = {
        "omni": lambda: omni_attention(q, k, v, omni_mask),
        "flash": lambda: flash(q, k, v, block_mask=block_mask, enable_gqa=True, kernel_options={"BACKEND": "FLASH"}),
        "cudnn": cudnn,
    }
    for name in args.impl:
        call = calls[name]
        for _ in range(3):
            torch.autograd.grad(call(), (q, k, v), dout)
        torch.cuda.synchronize()
        with torch.autograd.set_multithreading_enabled(False):
            torch.cuda.nvtx.range_push(name)
            torch.autograd.grad(call(), (q, k, v), dout)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        print(f"{name}: profiled one forward + backward ({args.mask}, S {args.seq_len}, D {args.head_dim})")


if __name__ == "__main__":
    main()
