"""A/B of token-rule PARTIAL tiles masked by row ranges (`OmniBlockMask.token_ranges`) against the same mask without
them (ids compared per element), one library, one process: per case and pass, a CUDA graph of 10 calls of each mask,
the two replayed alternately for --rounds rounds (do_bench median / 10 each), the median over rounds reported. The
last column says whether the two give bit for bit the same out and lse (forward) or dk and dv (backward; dq is
summed by reductions in any order, so it differs in the last bits from run to run anyway).

    python benchmarks/results/issue16/session11/ranges_ab.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import torch  # noqa: E402

from benchmarks import layouts, measure  # noqa: E402
from omni_hf import _cuda  # noqa: E402

# (mask, S, batch, heads_q, heads_kv, head dim)
CASES = [("vlm", s, 1, 32, 8, 128) for s in (8192, 16384, 32768)] + [
    (m, 16384, 1, 32, 8, 128) for m in ("documents", "prefix_lm", "sliding_window")] + [
    ("vlm", 16384, 1, 16, 8, 64), ("vlm", 4096, 1, 32, 8, 128)]
GRAPH_CALLS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"rounds {args.rounds} (median)")
    print("| case | pass | ranges us | ids us | ranges TFLOP/s | ids TFLOP/s | speed-up | equal |\n|" + "---|" * 8)
    for mask_name, seq_len, batch, heads_q, heads_kv, dim in CASES:
        layout = layouts.build(mask_name, seq_len)
        ranged = layout.omni_mask(128, "cuda")
        masks = {"ranges": ranged, "ids": dataclasses.replace(ranged, token_ranges=None)}
        gen = torch.Generator("cuda").manual_seed(seq_len)
        q, k, v = (torch.randn(batch, h, seq_len, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h in (heads_q, heads_kv, heads_kv))
        dout = torch.randn_like(q)
        scale = dim ** -0.5
        out, lse = _cuda.forward(q, k, v, ranged, scale, None)
        for which in ("fwd", "bwd"):
            graphs, outputs = {}, {}
            for name, mask in masks.items():
                if which == "fwd":
                    step = lambda m=mask: _cuda.forward(q, k, v, m, scale, None)  # noqa: E731
                else:
                    step = lambda m=mask: _cuda.backward(dout, q, k, v, out, lse, m, scale, None)  # noqa: E731
                graphs[name], outputs[name] = measure.capture_graph(lambda s=step: [s() for _ in range(GRAPH_CALLS)])
            times = {name: [] for name in masks}
            for _ in range(args.rounds):
                for name, graph in graphs.items():
                    times[name].append(measure.median_ms(graph.replay) * 1e3 / GRAPH_CALLS)
            us = {name: statistics.median(t) for name, t in times.items()}
            flop = (2.5 if which == "bwd" else 1.0) * 4 * batch * heads_q * dim * layout.allowed_pairs()
            compared = slice(0, 2) if which == "fwd" else slice(1, 3)  # (out, lse) or (dk, dv)
            pairs = zip(outputs["ranges"][-1][compared], outputs["ids"][-1][compared])
            equal = all(torch.equal(a, b) for a, b in pairs)
            print(f"| {mask_name} S{seq_len} H{heads_q}/{heads_kv} D{dim} | {which} | {us['ranges']:.0f} | "
                  f"{us['ids']:.0f} | {flop / us['ranges'] / 1e6:.0f} | {flop / us['ids'] / 1e6:.0f} | "
                  f"{us['ids'] / us['ranges']:.3f} | {equal} |", flush=True)


if __name__ == "__main__":
    main()
