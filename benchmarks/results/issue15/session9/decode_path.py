"""Session 9: which mask and kernel path eager decoding takes at batch 1 and 8."""
import collections, contextlib, os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from torch.profiler import profile, ProfilerActivity
from benchmarks.bench_decode import CONFIG, model_with, generate
from omni_hf.integrations import transformers as integ

seen = collections.Counter()
orig_mask, orig_spec = integ.omni_mask, integ._from_spec
def spy_spec(spec, device, cu):
    mask, order = orig_spec(spec, device, cu)
    seen[(spec.batch_size, spec.q_len, type(spec.q_offset).__name__, spec.padding_mask is None, mask.implicit, order is None)] += 1
    return mask, order
integ._from_spec = spy_spec
omni = model_with("omni", None)
for batch in (1, 8):
    prompts = torch.randint(3, CONFIG["vocab_size"], (batch, 1024), device="cuda")
    generate(omni, prompts, 4, disable_compile=True)
    seen.clear()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        generate(omni, prompts, 4, disable_compile=True)
    print("batch", batch, dict(seen))
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and ("omni" in e.key or "slice" in e.key or "merge" in e.key or "token" in e.key):
            print(f"  {e.key[:110]} calls {e.count} avg {e.device_time:.1f} us")
    for e in prof.key_averages():
        if e.key.startswith("omni_hf::"):
            print(f"  op {e.key} calls {e.count} cpu avg {e.cpu_time:.1f} us")
