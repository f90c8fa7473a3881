"""Host time of one decode forward, omni against SDPA-FA2, and of variants of the omni model that bisect it, with less
noise than a generate: `bench_decode`'s ~1B Llama holds a 1024-token prompt in a dynamic cache; each forward adds one
token (attention mask of ones, as generate passes it) and the cache is cropped back, so every forward sees the same
1025 keys. Bursts of 100 forwards per variant, the variants' turns rotated, a sync after each burst; the median burst.
The variants of the omni model: its attention op replaced by SDPA-FA2's call (``omni_python``: omni's mask and
attention functions, no omni kernel) or by nothing (``omni_no_op``: q handed back as the output, omni's Python alone); its attention function replaced by Transformers' sdpa one (``omni_mask_only``);
its mask function replaced by Transformers' sdpa one (``omni_sdpa_mask``: omni's attention gets no mask); its config
switched to sdpa (``omni_model_as_sdpa``: the omni model's instance, nothing of omni's).

    python benchmarks/results/decode/decode_forward_host.py [BURSTS [VARIANTS]]   (default 12; sdpa, omni, the variants, sdpa_again)
"""
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from benchmarks.bench_decode import eager_context, model_pair, random_prompts
from omni_hf.integrations.transformers import omni_attention_forward, omni_mask
from omni_hf.ops import attention as ops_attention

FORWARDS = 100


def fa2_forward(q, k, v, backend, mask_tensors, mask_sizes, scale, softcap):
    """omni's backend call for an implicit causal mask over as many keys as queries (the prompt) or one query,
    run by SDPA-FA2."""
    return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=q.shape[2] > 1, enable_gqa=True), None


def no_forward(q, k, v, backend, mask_tensors, mask_sizes, scale, softcap):
    """No attention: q handed back as the output (its layout is the op's), so that only omni's Python runs."""
    return q, None


def sdpa_without_mask(module, query, key, value, attention_mask, **kwargs):
    """Transformers' sdpa attention function, handed no mask (one query: nothing to mask)."""
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


@contextlib.contextmanager
def variant(name, omni_model):
    """The omni model as the variant ``name`` (the module docstring's; "sdpa" and "omni" change nothing)."""
    original = ops_attention._forward
    if name == "omni_python":
        ops_attention._forward = fa2_forward
    if name == "omni_no_op":
        ops_attention._forward = no_forward
    if name == "omni_mask_only":
        AttentionInterface.register("omni", sdpa_without_mask)
    if name == "omni_sdpa_mask":
        AttentionMaskInterface.register("omni", sdpa_mask)
    if name == "omni_model_as_sdpa":
        omni_model.config._attn_implementation = "sdpa"
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name.startswith("omni_") else contextlib.nullcontext():
            yield
    finally:
        ops_attention._forward = original
        AttentionInterface.register("omni", omni_attention_forward)
        AttentionMaskInterface.register("omni", omni_mask)
        omni_model.config._attn_implementation = "omni"


def burst_ms(model, prompt_cache, token, mask):
    """Milliseconds per forward over FORWARDS one-token forwards, the cache cropped back after each."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(FORWARDS):
        model(token, past_key_values=prompt_cache, attention_mask=mask, use_cache=True)
        prompt_cache.crop(-1)  # the token just added
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / FORWARDS * 1e3


bursts = int(sys.argv[1]) if len(sys.argv) > 1 else 12
names = (sys.argv[2].split(",") if len(sys.argv) > 2 else
         ["sdpa", "omni", "omni_python", "omni_mask_only", "omni_sdpa_mask", "sdpa_again"])
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
sdpa, omni = model_pair()
with torch.no_grad():
    for batch in (1, 8):
        prompts = random_prompts(batch, 1024)
        token = prompts[:, -1:]
        mask = torch.ones(batch, 1025, dtype=torch.long, device="cuda")
        caches = {}
        for model in (sdpa, omni):
            cache = DynamicCache(config=model.config)
            model(prompts, past_key_values=cache, use_cache=True)
            caches[id(model)] = cache
        times = {name: [] for name in names}
        for rnd in range(bursts + 1):  # burst 0 warms up
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                model = sdpa if name.startswith("sdpa") else omni
                with variant(name, omni), eager_context(model):
                    ms = burst_ms(model, caches[id(model)], token, mask)
                if rnd:
                    times[name].append(ms)
        base = statistics.median(times["sdpa"])
        for name, ms in times.items():
            median = statistics.median(ms)
            print(f"batch {batch} {name:15s}: {median:.3f} ms per forward ({median / base:.3f}x sdpa; bursts "
                  f"{min(ms):.3f}-{max(ms):.3f})", flush=True)
