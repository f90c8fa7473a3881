"""Host time of one decode step's attention call, piece by piece, omni against SDPA-FA2: q ``[B, 32, 1, 64]`` (the
transposed ``[B, 1, 32, 64]`` Transformers hands over), k / v ``[B, 8, 1088, 64]`` bf16, B 1 and 8. Each line calls
its piece in five bursts of 3000 calls without a sync (`benchmarks.bench_launch.host_us`: the GPU keeps up, the host
is the bound), the median per call.

    python benchmarks/results/decode/decode_host_calls.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import causal_mask_function

from benchmarks.bench_launch import host_us
from omni_hf import OmniBlockMask, omni_attention
from omni_hf.integrations.transformers import attention as integration, spec as spec_module
from omni_hf.ops import attention as ops_attention, library


class Layer(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 4


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
assert library.available(), "the CUDA library does not load"
layer, kv = Layer(), 1088
torch.set_grad_enabled(False)
for batch in (1, 8):
    q = torch.randn(batch, 1, 32, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(batch, 8, kv, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    padding = torch.ones(batch, kv, dtype=torch.long, device="cuda")
    spec = spec_module.omni_mask(batch, 1, kv, q_offset=kv - 1, mask_function=causal_mask_function,
                                 attention_mask=padding)
    mask = OmniBlockMask.causal(1, kv)
    tensors, sizes = mask.as_tuple()
    call = ops_attention.prepare_call(q, k, v, mask, 0.125, None)
    pieces = {
        "F.sdpa (FA2, enable_gqa)": lambda: F.scaled_dot_product_attention(q, k, v, scale=0.125, enable_gqa=True),
        "sdpa_attention_forward": lambda: sdpa_attention_forward(layer, q, k, v, None, scaling=0.125),
        "omni_hf::fwd op": lambda: library.forward(q, k, v, tensors, sizes, 0.125, 0.0),
        "omni_attention": lambda: omni_attention(q, k, v, mask, scale=0.125),
        "omni_attention_forward": lambda: integration.omni_attention_forward(layer, q, k, v, spec, scaling=0.125),
        "  prepare_call": lambda: ops_attention.prepare_call(q, k, v, mask, 0.125, None),
        "  run_call": lambda: ops_attention.run_call(call, q, k, v),
        "  _spec_call (per forward once)": lambda: integration._spec_call(spec, q, k, v, 0.125, None),
        "sdpa mask's sync (per step)": lambda: bool(padding.sum() == padding.numel()),
        "omni_mask (per step)": lambda: spec_module.omni_mask(batch, 1, kv, q_offset=kv - 1,
                                                              mask_function=causal_mask_function,
                                                              attention_mask=padding),
    }
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for name, fn in pieces.items():
            print(f"batch {batch} {name:32s} {host_us(fn, calls=15000, burst=3000):6.1f} us", flush=True)
