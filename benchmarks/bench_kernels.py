"""omni alone on the realistic shape, for kernel work: forward, forward+backward and the backward by difference.

    python -m benchmarks.bench_kernels [--masks vlm,causal] [--seqlens 8192,16384]

The suite's realistic shape (B=1, Hq=32, Hkv=8, D=128, bf16, blocks of 128); TFLOP/s over the allowed (q, k) pairs
(4 * Hq * D flops per pair forward,
2.5 times that backward), do_bench medians. No peers and no reference check: `python -m benchmarks.run` does
those. Run it with OMNI_HF_CUDA_LIB set to compare two builds of the library. The first line is the physical
yardstick: a plain bf16 GEMM (8192^3, torch.matmul) on the same GPU, and each case gives its forward rate as a
fraction of it.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import layouts, measure
from benchmarks.run import SHAPES
from omni_hf import omni_attention

SHAPE = SHAPES["realistic"]


def gemm_tflops(n: int = 8192) -> float:
    """TFLOP/s of an n x n x n bf16 matmul (do_bench median)."""
    gen = torch.Generator("cuda").manual_seed(0)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    return 2 * n**3 / measure.median_ms(lambda: a @ b) / 1e9


def time_case(name: str, seq_len: int, gemm: float) -> str:
    """One line: forward, forward+backward and backward TFLOP/s and milliseconds of mask `name` at `seq_len`."""
    layout = layouts.build(name, seq_len)
    mask = layout.omni_mask(SHAPE.blocks[0], "cuda")
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(SHAPE.batch, heads, seq_len, SHAPE.dim, device="cuda", generator=gen, dtype=SHAPE.dtype)
               for heads in (SHAPE.heads_q, SHAPE.heads_kv, SHAPE.heads_kv))
    dout = torch.randn_like(q)

    def attention(q, k, v):
        return omni_attention(q, k, v, mask, scale=SHAPE.dim**-0.5)

    fwd_ms = measure.median_ms(measure.forward_fn(attention, q, k, v))
    both_ms = measure.median_ms(measure.forward_backward_fn(attention, q, k, v, dout))
    flop = 4 * SHAPE.batch * SHAPE.heads_q * SHAPE.dim * layout.allowed_pairs()
    return (f"{name:8s} S={seq_len:6d} TFLOP/s fwd {flop / fwd_ms / 1e9:4.0f}  "
            f"fwd+bwd {3.5 * flop / both_ms / 1e9:4.0f}  "
            f"bwd {2.5 * flop / (both_ms - fwd_ms) / 1e9:4.0f}  (fwd {fwd_ms:.3f} ms, fwd+bwd {both_ms:.3f} ms; "
            f"fwd {flop / fwd_ms / 1e9 / gemm:.0%} of the GEMM)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masks", default="vlm,causal", help=f"comma-separated of {layouts.MASKS}")
    parser.add_argument("--seqlens", default="8192,16384", help="comma-separated lengths")
    args = parser.parse_args(argv)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    gemm = gemm_tflops()
    print(f"bf16 GEMM 8192^3 (torch.matmul): {gemm:.0f} TFLOP/s", flush=True)
    for name in args.masks.split(","):
        for seq_len in map(int, args.seqlens.split(",")):
            print(time_case(name, seq_len, gemm), flush=True)


if __name__ == "__main__":
    main()
