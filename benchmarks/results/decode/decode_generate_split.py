"""Where generate's time goes, omni against SDPA-FA2 (`benchmarks.bench_decode`'s ~1B Llama, a 1024-token prompt,
batch 1 and 8): the prompt's forward alone (synchronised), `bench_decode.generate` of 1 and of 64 new tokens; six
timed rounds, the backends' turn order alternating; medians.

    python benchmarks/results/decode/decode_generate_split.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_decode import eager_context, generate, model_pair, random_prompts
sdpa, omni = model_pair()
for batch in (1, 8):
    prompts = random_prompts(batch, 1024)
    res = {"sdpa": {"prefill": [], "gen1": [], "gen64": []}, "omni": {"prefill": [], "gen1": [], "gen64": []}}
    for rnd in range(7):
        for name, model in (("sdpa", sdpa), ("omni", omni)) if rnd % 2 else (("omni", omni), ("sdpa", sdpa)):
            with eager_context(model), torch.no_grad():
                torch.cuda.synchronize(); t = time.perf_counter()
                model(prompts, attention_mask=torch.ones_like(prompts))
                torch.cuda.synchronize(); p = time.perf_counter() - t
                g1 = generate(model, prompts, 1, disable_compile=True)[0]
                g64 = generate(model, prompts, 64, disable_compile=True)[0]
            if rnd:
                for key, seconds in (("prefill", p), ("gen1", g1), ("gen64", g64)):
                    res[name][key].append(seconds)
    for name, r in res.items():
        print(f"batch {batch} {name}: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in r.items()),
              flush=True)
