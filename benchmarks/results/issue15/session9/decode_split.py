"""Session 9: batch-8 eager decoding, omni vs SDPA-FA2, and omni's integration with SDPA-FA2 as the kernel call."""
import contextlib, os, statistics, sys
sys.path.insert(0, os.getcwd())
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from benchmarks.bench_decode import CONFIG, model_with, generate
from omni_hf.integrations import transformers as integ

omni_call = integ.omni_attention
def fa2_call(q, k, v, mask, scale=None, softcap=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, scale=scale,
                                                            enable_gqa=q.shape[1] != k.shape[1])
rounds, new, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sdpa = model_with("sdpa", None)
omni = model_with("omni", sdpa.state_dict())
prompts = torch.randint(3, CONFIG["vocab_size"], (batch, 1024), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(batch))
runs = {"sdpa": (sdpa, None), "omni": (omni, omni_call), "omni_integration+fa2": (omni, fa2_call)}
secs = {n: [] for n in runs}
for rnd in range(rounds + 1):
    for name, (model, call) in runs.items():
        if call is not None:
            integ.omni_attention = call
        fa2 = name != "omni"
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if fa2 else contextlib.nullcontext():
            t = generate(model, prompts, new, disable_compile=True)[0]
        if rnd:
            secs[name].append(t)
integ.omni_attention = omni_call
for name, v in secs.items():
    r = statistics.median(s / x for s, x in zip(secs["sdpa"], v))
    print(f"batch {batch} {name}: {batch * new / statistics.median(v):.0f} tok/s, per-round vs sdpa {r:.3f}", flush=True)
