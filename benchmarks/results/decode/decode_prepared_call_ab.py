"""The prepared call's effect on eager decoding, in one process: omni's attention function (one prepared call per
forward: checks, backend choice and the flattened mask looked up per layer) against the same function doing that
work at every layer (``omni_per_layer``: the layer's cached mask handed to `omni_attention`, as before the prepared
call), with SDPA-FA2 and an SDPA-against-SDPA control, in rotated turns; the omni model switches between the two
functions by its config. `benchmarks.bench_decode`'s ~1B Llama, prompts of 1024 random tokens.

    python benchmarks/results/decode/decode_prepared_call_ab.py [ROUNDS] [NEW_TOKENS]   (default 12, 64)

Per batch: tokens/s of each and the per-round ratios to SDPA (median), and omni / omni_per_layer.
"""
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from benchmarks.bench_decode import eager_context, generate, model_pair, random_prompts
from omni_hf import omni_attention
from omni_hf.integrations.transformers import attention as integration, omni_mask


def omni_per_layer(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None, **kwargs):
    """omni's attention function for a model's call (a spec, no special kwargs; a dynamic cache: no key order) with
    the checks, backend choice and flattening at every layer."""
    assert integration._SPECIAL_KWARGS.isdisjoint(kwargs) and type(attention_mask) is integration.OmniMaskSpec
    block_mask, _ = integration._spec_mask(attention_mask, query.device, None)
    out = omni_attention(query, key, value, block_mask, scale=scaling, softcap=softcap)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("omni_per_layer", omni_per_layer)
AttentionMaskInterface.register("omni_per_layer", omni_mask)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
new = int(sys.argv[2]) if len(sys.argv) > 2 else 64
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
sdpa, omni = model_pair()
names = ["sdpa", "omni", "omni_per_layer", "sdpa_again"]
for batch in (1, 8):
    prompts = random_prompts(batch, 1024)
    secs = {name: [] for name in names}
    for rnd in range(rounds + 1):  # round 0 warms up
        for name in names[rnd % 4:] + names[:rnd % 4]:
            model = sdpa if name.startswith("sdpa") else omni
            if model is omni:
                omni.config._attn_implementation = name
            with eager_context(model):
                seconds = generate(model, prompts, new, disable_compile=True)[0]
            if rnd:
                secs[name].append(seconds)
    omni.config._attn_implementation = "omni"
    per_round = {name: statistics.median(a / b for a, b in zip(secs["sdpa"], secs[name])) for name in names[1:]}
    gain = statistics.median(a / b for a, b in zip(secs["omni_per_layer"], secs["omni"]))
    print(f"batch {batch}: tok/s " + ", ".join(f"{n} {batch * new / statistics.median(s):.0f}" for n, s in secs.items())
          + "; per-round median ratio to sdpa: " + ", ".join(f"{n} {r:.3f}" for n, r in per_round.items())
          + f"; omni / omni_per_layer {gain:.3f}", flush=True)
