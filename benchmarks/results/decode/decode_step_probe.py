"""Where a decode step's time goes, omni against SDPA-FA2 (`benchmarks.bench_decode`'s ~1B Llama): one-token
forwards after a 1024-token prefill (DynamicCache, an all-ones attention mask as generate passes, batch 1 and 8),
synchronised per step, 40 steps per turn, the backends alternating over three timed turns; the host time inside the
attention function and inside the mask function per step (Transformers' registries, wrapped).

    python benchmarks/results/decode/decode_step_probe.py
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface
from benchmarks.bench_decode import eager_context, model_pair, random_prompts  # imports omni_hf, which registers "omni"
acc = {}


def wrap(registry, key, tag):
    fn = registry._global_mapping[key]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        acc[tag] = acc.get(tag, 0.0) + time.perf_counter() - start
        return result

    registry._global_mapping[key] = timed



for key in ("omni", "sdpa"):
    wrap(AttentionInterface, key, "attn")
    wrap(AttentionMaskInterface, key, "mask")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
sdpa, omni = model_pair()
for batch in (1, 8):
    ids = random_prompts(batch, 1025)
    res = {}
    for rnd in range(4):
        for name, model in (("sdpa", sdpa), ("omni", omni)) if rnd % 2 == 0 else (("omni", omni), ("sdpa", sdpa)):
            with eager_context(model), torch.no_grad():
                cache = DynamicCache(config=model.config)
                ones = torch.ones_like(ids)
                model(ids[:, :1024], attention_mask=ones[:, :1024], past_key_values=cache, use_cache=True)
                torch.cuda.synchronize()
                steps, a, m = [], [], []
                for i in range(40):
                    acc.clear()
                    t = time.perf_counter()
                    model(ids[:, 1024:1025], attention_mask=ones, past_key_values=cache, use_cache=True)
                    torch.cuda.synchronize()
                    steps.append(time.perf_counter() - t); a.append(acc.get("attn", 0)); m.append(acc.get("mask", 0))
                    cache.crop(1024)
            if rnd:
                res.setdefault(name, []).append((statistics.median(steps), statistics.median(a), statistics.median(m)))
    for name, rows in res.items():
        s, a, m = (statistics.median(x[i] for x in rows) * 1e3 for i in range(3))
        print(f"batch {batch} {name}: step {s:.3f} ms, attention functions {a:.3f} ms (16 layers), "
              f"mask function {m:.3f} ms", flush=True)
