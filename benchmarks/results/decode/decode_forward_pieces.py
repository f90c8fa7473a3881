"""Host time of the attention function's pieces inside real decode forwards (`decode_forward_host.py`'s fixed-length
cache, 100 forwards per burst, 10 bursts): each piece wrapped in a host clock, the mean per call. omni: its attention
function, its prepared call's lookup (`_spec_call`) and run (`run_call`), and the op; SDPA-FA2: Transformers' sdpa
attention function and `F.scaled_dot_product_attention`.

    python benchmarks/results/decode/decode_forward_pieces.py
"""
import collections
import functools
import os
import sys
import time

sys.path.insert(0, os.getcwd())

import torch
import transformers.integrations.sdpa_attention as sdpa_module
from transformers import AttentionInterface, DynamicCache

from benchmarks.bench_decode import eager_context, model_pair, random_prompts
from omni_hf.integrations.transformers import attention as integration
from omni_hf.ops import attention as ops_attention, library

SECONDS, CALLS = collections.Counter(), collections.Counter()


def clocked(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SECONDS[name] += time.perf_counter() - start
            CALLS[name] += 1
    return wrapper


AttentionInterface.register("omni", clocked("omni_attention_forward", integration.omni_attention_forward))
AttentionInterface.register("sdpa", clocked("sdpa_attention_forward", sdpa_module.sdpa_attention_forward))
integration._spec_call = clocked("_spec_call", integration._spec_call)
integration.run_call = clocked("run_call", integration.run_call)
library.forward = clocked("omni_hf::fwd (library.forward)", library.forward)
torch.nn.functional.scaled_dot_product_attention = clocked("F.scaled_dot_product_attention",
                                                           torch.nn.functional.scaled_dot_product_attention)

print(torch.cuda.get_device_name(), torch.__version__, flush=True)
sdpa, omni = model_pair()
with torch.no_grad():
    for batch in (1, 8):
        prompts = random_prompts(batch, 1024)
        token, mask = prompts[:, -1:], torch.ones(batch, 1025, dtype=torch.long, device="cuda")
        for name, model in (("sdpa", sdpa), ("omni", omni)):
            cache = DynamicCache(config=model.config)
            model(prompts, past_key_values=cache, use_cache=True)
            for burst in range(11):
                if burst == 1:
                    SECONDS.clear(), CALLS.clear()
                torch.cuda.synchronize()
                start = time.perf_counter()
                with eager_context(model):
                    for _ in range(100):
                        model(token, past_key_values=cache, attention_mask=mask, use_cache=True)
                        cache.crop(-1)
                torch.cuda.synchronize()
            print(f"batch {batch} {name}: {(time.perf_counter() - start) * 10:.3f} ms per forward (last burst)")
            for piece in SECONDS:
                print(f"  {piece:32s} {SECONDS[piece] / CALLS[piece] * 1e6:7.1f} us per call ({CALLS[piece]} calls)")
            sys.stdout.flush()
