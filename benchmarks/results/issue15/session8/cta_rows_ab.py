"""A/B of the sm_90a forward's CTA height, omni alone: per library, the kernel time (a CUDA graph of 20 forwards,
do_bench median / 20) and the eager time (do_bench median of one call, host included) of each case. Each library
runs in its own process (two cannot register the same torch ops), the libraries alternate for --rounds rounds
and each figure is the median of its rounds.

    python benchmarks/results/issue15/session8/cta_rows_ab.py NAME=LIB.so NAME=LIB.so ... [--rounds 3] [--cases SET]

(The committed logs were made before it timed through `benchmarks.measure`: the same do_bench settings, its own
capture with one warm-up call instead of capture_graph's three.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
# (mask, S, batch, heads_q, heads_kv, head dim, dtype). "small": issue 15's small shape, head dim 128 on both
# sides of the 64-row threshold, and issue 16's realistic shape (128-row CTAs in every library but a forced-64
# one); "d64": head dim 64 at grids of 2 to 32 waves of 64-row CTAs.
CASE_SETS = {
    "small": [(m, s, 1, 8, 8, 64, "float16") for m in ("causal", "vlm") for s in (512, 1024, 2048, 4096)]
    + [("causal", 1024, 1, 8, 8, 128, "bfloat16"), ("causal", 2048, 1, 4, 4, 128, "bfloat16"),
       ("causal", 2048, 1, 8, 8, 128, "bfloat16"), ("vlm", 2048, 1, 8, 8, 128, "bfloat16"),
       ("causal", 8192, 1, 32, 8, 128, "bfloat16"), ("vlm", 8192, 1, 32, 8, 128, "bfloat16")],
    "d64": [(m, s, 1, h, 8, 64, "bfloat16") for m in ("causal", "vlm") for s, h in
            ((4096, 16), (8192, 8), (4096, 32), (8192, 32), (16384, 32))],
    # Head dim 64 grids of 133 to 264 64-row CTAs (two per SM, all resident: the launch-order fold applies).
    "pairs": [("causal", 2048, 1, 8, 8, 64, "float16"), ("vlm", 2048, 1, 8, 8, 64, "float16"),
              ("causal", 1536, 1, 8, 8, 64, "float16"), ("causal", 3072, 1, 4, 4, 64, "float16"),
              ("causal", 2048, 2, 4, 4, 64, "float16"), ("causal", 1024, 2, 8, 8, 64, "float16"),
              ("causal", 2048, 1, 16, 8, 64, "float16"), ("vlm", 1024, 2, 8, 8, 64, "float16")],
}
GRAPH_CALLS = 20


def measure_all(cases: list[tuple]) -> list[dict]:
    """Kernel and eager microseconds and TFLOP/s of every case with the library this process loaded."""
    import torch

    from benchmarks import layouts, measure
    from omni_hf import omni_attention

    rows = []
    for mask_name, seq_len, batch, heads_q, heads_kv, dim, dtype in cases:
        layout = layouts.build(mask_name, seq_len)
        mask = layout.omni_mask(128, "cuda")
        gen = torch.Generator("cuda").manual_seed(seq_len)
        q, k, v = (torch.randn(batch, h, seq_len, dim, device="cuda", dtype=getattr(torch, dtype), generator=gen)
                   for h in (heads_q, heads_kv, heads_kv))

        def call():
            return omni_attention(q, k, v, mask)

        with torch.no_grad():
            eager_us = measure.median_ms(call) * 1e3
            graph, _ = measure.capture_graph(lambda: [call() for _ in range(GRAPH_CALLS)])
            kernel_us = measure.median_ms(graph.replay) * 1e3 / GRAPH_CALLS
        flop = 4 * batch * heads_q * dim * layout.allowed_pairs()
        rows.append({"case": f"{mask_name} S{seq_len} B{batch} H{heads_q}/{heads_kv} D{dim}", "kernel_us": kernel_us,
                     "eager_us": eager_us, "kernel_tflops": flop / kernel_us / 1e6})
    return rows


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks import measure

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libs", nargs="+", help="NAME=path/to/libomni_hf_cuda.so")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default="small", choices=tuple(CASE_SETS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = CASE_SETS[args.cases]
    if args.child:
        print(json.dumps(measure_all(cases)))
        return
    libs = dict(arg.split("=", 1) for arg in args.libs)
    runs = measure.alternate_libraries(__file__, ["--cases", args.cases, "x=y"], libs, args.rounds, str(ROOT))
    import torch
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"rounds {args.rounds} (median)")
    header = ["case"] + [f"{name} {col}" for name in libs for col in ("kernel us", "TFLOP/s", "eager us")]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for i in range(len(cases)):
        cells = [runs[next(iter(libs))][0][i]["case"]]
        for name in libs:
            med = {key: statistics.median(r[i][key] for r in runs[name]) for key in ("kernel_us", "kernel_tflops", "eager_us")}
            cells += [f"{med['kernel_us']:.1f}", f"{med['kernel_tflops']:.0f}", f"{med['eager_us']:.1f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
