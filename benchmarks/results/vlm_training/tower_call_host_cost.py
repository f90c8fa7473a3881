"""Host cost per attention call of a Qwen2.5-VL window (64 patches, 16 heads of 80), omni vs sdpa, no grad."""
import time, torch
import torch.nn.functional as F
import omni_hf
from omni_hf import OmniBlockMask, omni_attention
from omni_hf.integrations.transformers.attention import omni_attention_forward
from omni_hf.ops import library
from transformers.integrations.sdpa_attention import sdpa_attention_forward

class M(torch.nn.Module):
    is_causal = False
    num_key_value_groups = 1
m = M()
def per_call(fn, n=3000):
    for _ in range(200): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6

S, H = 64 * 40, 16
for D in (80, 128):
    qkv = torch.randn(S, 3, H, D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.permute(1, 0, 2, 3).unbind(0))
    qs, ks, vs = (torch.split(t, 64, dim=2)[3] for t in (q, k, v))
    mask = OmniBlockMask.full(64, 64)
    tensors, sizes = mask.as_tuple()
    with torch.no_grad():
        rows = {
            "sdpa_attention_forward": lambda: sdpa_attention_forward(m, qs, ks, vs, None, scaling=0.1, is_causal=False),
            "omni_attention_forward": lambda: omni_attention_forward(m, qs, ks, vs, None, scaling=0.1, is_causal=False),
            "omni_attention": lambda: omni_attention(qs, ks, vs, mask, scale=0.1),
            "OmniBlockMask.full": lambda: OmniBlockMask.full(64, 64),
            "pad x3": lambda: [F.pad(t.transpose(1, 2), (0, 128 - D)).transpose(1, 2) for t in (qs, ks, vs)] if D < 128 else None,
            "F.sdpa": lambda: F.scaled_dot_product_attention(qs, ks, vs, scale=0.1),
        }
        if D == 128:
            rows["library.forward"] = lambda: library.forward(qs, ks, vs, tensors, sizes, 0.1, 0.0)
        for name, fn in rows.items():
            print(f"D{D} {name:26s} {per_call(fn):7.1f} us/call")
