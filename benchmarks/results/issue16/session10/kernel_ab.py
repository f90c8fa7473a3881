"""A/B of the sm_90a kernels, omni alone: per library, the kernel time of the forward or the backward op (the
backward: preprocess, main kernel and dQ conversion) from a CUDA graph of 10 calls (do_bench median / 10), TFLOP/s
over allowed pairs (the backward counts 2.5x the forward's flops). Each library runs in its own process (two
cannot register the same torch ops), the libraries alternate for --rounds rounds and each figure is the median of
its rounds; the last column compares each library's gradients or output (sum of |x|) with the first library's.

    python benchmarks/results/issue16/session10/kernel_ab.py NAME=LIB.so NAME=LIB.so ... [--pass fwd|bwd] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
# (mask, S, batch, heads_q, heads_kv, head dim, dtype)
REALISTIC = [(m, s, 1, 32, 8, 128, "bfloat16") for m in ("vlm", "causal") for s in (8192, 16384, 32768)]
CASES = {
    "bwd": REALISTIC,
    # the realistic shape, the suite's other masks, head dim 64, and grids of a few waves
    "fwd": REALISTIC + [(m, 16384, 1, 32, 8, 128, "bfloat16") for m in ("documents", "prefix_lm", "sliding_window")]
    + [("vlm", 16384, 1, 16, 8, 64, "bfloat16"), ("causal", 4096, 2, 16, 8, 128, "bfloat16"),
       ("vlm", 4096, 1, 32, 8, 128, "bfloat16"), ("causal", 2048, 4, 32, 8, 128, "float16")],
}
GRAPH_CALLS = 10


def measure_all(which: str) -> list[dict]:
    """Kernel microseconds and TFLOP/s of every case of pass `which` with the library this process loaded."""
    import torch

    from benchmarks import layouts, measure
    from omni_hf import _cuda

    rows = []
    for mask_name, seq_len, batch, heads_q, heads_kv, dim, dtype in CASES[which]:
        layout = layouts.build(mask_name, seq_len)
        mask = layout.omni_mask(128, "cuda")
        gen = torch.Generator("cuda").manual_seed(seq_len)
        q, k, v = (torch.randn(batch, h, seq_len, dim, device="cuda", dtype=getattr(torch, dtype), generator=gen)
                   for h in (heads_q, heads_kv, heads_kv))
        dout = torch.randn_like(q)
        scale = dim ** -0.5
        out, lse = _cuda.forward(q, k, v, mask, scale, None)
        if which == "bwd":
            step = lambda: _cuda.backward(dout, q, k, v, out, lse, mask, scale, None)  # noqa: E731
        else:
            step = lambda: _cuda.forward(q, k, v, mask, scale, None)[:1]  # noqa: E731
        graph, outputs = measure.capture_graph(lambda: [step() for _ in range(GRAPH_CALLS)])
        kernel_us = measure.median_ms(graph.replay) * 1e3 / GRAPH_CALLS
        flop = (2.5 if which == "bwd" else 1.0) * 4 * batch * heads_q * dim * layout.allowed_pairs()
        rows.append({"case": f"{mask_name} S{seq_len} B{batch} H{heads_q}/{heads_kv} D{dim}", "kernel_us": kernel_us,
                     "tflops": flop / kernel_us / 1e6, "sums": [float(t.double().abs().sum()) for t in outputs[-1]]})
    return rows


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks import measure

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libs", nargs="+", help="NAME=path/to/libomni_hf_cuda.so")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pass", dest="which", default="bwd", choices=tuple(CASES))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_all(args.which)))
        return
    libs = dict(arg.split("=", 1) for arg in args.libs)
    runs = measure.alternate_libraries(__file__, ["--pass", args.which, "x=y"], libs, args.rounds, str(ROOT))
    import torch
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"rounds {args.rounds} (median)")
    first = next(iter(libs))
    print(f"pass: {args.which}")
    header = ["case"] + [f"{name} {col}" for name in libs for col in ("us", "TFLOP/s")] + ["|sum| rel. diff vs " + first]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for i in range(len(CASES[args.which])):
        cells = [runs[first][0][i]["case"]]
        for name in libs:
            cells += [f"{statistics.median(r[i]['kernel_us'] for r in runs[name]):.0f}",
                      f"{statistics.median(r[i]['tflops'] for r in runs[name]):.0f}"]
        ref = runs[first][0][i]["sums"]
        worst = max(abs(a - b) / b for name in libs for a, b in zip(runs[name][0][i]["sums"], ref))
        cells.append(f"{worst:.1e}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
