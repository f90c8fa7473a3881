"""Session 9: host cost of omni's decode path vs its regular forward vs SDPA-FA2, and the CUDA API calls under it."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import SDPBackend, sdpa_kernel
from benchmarks.bench_launch import host_us
from omni_hf import OmniBlockMask, omni_attention

def shapes(b, hq, hkv, sq, skv, d, dtype):
    g = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g).transpose(1, 2)
    k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    return q, k, v

cases = {"decode B1 32/8 kv1088 D64": (1, 32, 8, 1, 1088, 64), "decode B8 32/8 kv1088 D64": (8, 32, 8, 1, 1088, 64),
         "decode B1 16/4 kv2048 D128": (1, 16, 4, 1, 2048, 128), "prefill B1 8/8 S512 D64": (1, 8, 8, 512, 512, 64)}
with torch.no_grad():
    for name, (b, hq, hkv, sq, skv, d) in cases.items():
        q, k, v = shapes(b, hq, hkv, sq, skv, d, torch.bfloat16)
        mask = OmniBlockMask.causal(sq, skv)
        tensors, sizes = mask._op_args()
        num, indices, types, partial, _, _, _, _, pool, doc, grp = tensors
        _, _, bq, bkv, window, kind = sizes
        fns = {"omni_attention": lambda: omni_attention(q, k, v, mask),
               "op direct": lambda: torch.ops.omni_hf.fwd.default(q, k, v, num, indices, types, partial, pool, doc, grp,
                                                                  kind, bq, bkv, window, 0.125, 0.0)}
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fns["sdpa fa2"] = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=sq > 1,
                                                                                       enable_gqa=hq != hkv)
            print(name, ", ".join(f"{n} {host_us(f, 1000):.1f} us" for n, f in fns.items()), flush=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(100):
                fns["op direct"]()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))
