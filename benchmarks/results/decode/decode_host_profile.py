"""Host time of eager greedy decoding, omni against SDPA-FA2 (`benchmarks.bench_decode`'s ~1B Llama, batch 1, a
1024-token prompt): wall time per new token of 32, twice per backend, then one generate of 32 new tokens per backend
under torch.profiler (CPU activities only) with the top ops by self CPU time.

    python benchmarks/results/decode/decode_host_profile.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())

import torch
from torch.profiler import ProfilerActivity, profile
from benchmarks.bench_decode import eager_context, generate, model_pair, random_prompts

print(torch.cuda.get_device_name(), torch.__version__, flush=True)
sdpa, omni = model_pair()
prompts = random_prompts(1, 1024)
for name, model in (("sdpa", sdpa), ("omni", omni), ("sdpa", sdpa), ("omni", omni)):
    with eager_context(model):
        generate(model, prompts, 8, disable_compile=True)
        t = generate(model, prompts, 32, disable_compile=True)[0]
        print(f"{name}: {t / 32 * 1e3:.2f} ms per token", flush=True)
for name, model in (("sdpa", sdpa), ("omni", omni)):
    with eager_context(model), profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(model, prompts, 32, disable_compile=True)
    print(f"==== {name}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22), flush=True)
