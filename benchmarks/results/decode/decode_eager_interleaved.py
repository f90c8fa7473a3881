"""Eager greedy decoding in Transformers, tokens/s: omni against SDPA on its FlashAttention-2 backend, with an
SDPA-against-SDPA control, the three interleaved within each round so that the host's drift falls on all alike, and
their turn order rotated from round to round so that each takes each place equally often.
`benchmarks.bench_decode`'s ~1B Llama (random weights, bf16, 32 / 8 heads of 64), prompts of 1024 random tokens.

    python benchmarks/results/decode/decode_eager_interleaved.py [ROUNDS] [NEW_TOKENS]   (default 10, 64)

Per batch: the median tokens/s of each, and the per-round ratios omni / sdpa and sdpa_again / sdpa (median and all).
"""
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())

import torch

from benchmarks.bench_decode import eager_context, generate, model_pair, random_prompts

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
new = int(sys.argv[2]) if len(sys.argv) > 2 else 64
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
sdpa, omni = model_pair()
for batch in (1, 8):
    prompts = random_prompts(batch, 1024)
    runs = {"sdpa": sdpa, "omni": omni, "sdpa_again": sdpa}
    secs = {name: [] for name in runs}
    names = list(runs)
    for rnd in range(rounds + 1):  # round 0 warms up
        for name in names[rnd % 3:] + names[:rnd % 3]:
            model = runs[name]
            with eager_context(model):
                seconds = generate(model, prompts, new, disable_compile=True)[0]
            if rnd:
                secs[name].append(seconds)
    tokens_per_s = {name: batch * new / statistics.median(s) for name, s in secs.items()}
    ratios = {name: sorted(a / b for a, b in zip(secs["sdpa"], secs[name])) for name in ("omni", "sdpa_again")}
    print(f"batch {batch}: tok/s " + ", ".join(f"{n} {v:.0f}" for n, v in tokens_per_s.items())
          + f"; per-round omni/sdpa median {statistics.median(ratios['omni']):.3f}"
          + f" (sorted {[round(x, 3) for x in ratios['omni']]})"
          + f"; control sdpa_again/sdpa median {statistics.median(ratios['sdpa_again']):.3f}", flush=True)
