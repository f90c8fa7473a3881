"""Diagnostics behind issue 15's session-6 finding (run from the repository root on a GPU with the library):
    python benchmarks/results/issue15/session6/profile_decode.py   -> profile.log
where an eager decode step's host time goes, omni vs SDPA-FA2 (torch.profiler over generate), and a per-call host
breakdown. Run 2 of the session, on the library of commit 0244fdb (before the autograd change)."""
import sys, time, statistics, contextlib, os
sys.path.insert(0, os.getcwd())
import torch
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import SDPBackend, sdpa_kernel
from benchmarks.bench_decode import CONFIG, model_with, generate
from benchmarks.bench_launch import host_us
import omni_hf
from omni_hf import OmniBlockMask, omni_attention, ops, _cuda
from omni_hf.integrations import transformers as integ

# --- per-call host breakdown at decode shape (Llama-1B layer: q 1x32, kv 1088x8, D 64)
q = torch.randn(1, 1, 32, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
k = torch.randn(1, 8, 1088, 64, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
mask = OmniBlockMask.causal(1, 1088)
tensors, sizes = mask._op_args()
print("op args", sizes, [t is None for t in tensors])
cases = {
    "omni_attention": lambda: omni_attention(q, k, v, mask),
    "op direct": lambda: torch.ops.omni_hf.fwd.default(q, k, v, *(None,) * 7, 1, 128, 128, 0, 0.125, 0.0),
    "_check_inputs": lambda: ops._check_inputs(q, k, v, mask, None, None),
    "_backend": lambda: ops._backend(q, mask),
    "_op_args": lambda: mask._op_args(),
    "causal build": lambda: OmniBlockMask.causal(1, 1088),
    "q.add(1)": lambda: q.add(1),
    "empty": lambda: torch.empty(16, device="cuda"),
    "sdpa fa2 gqa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=False),
}
spec = integ.omni_mask(1, 1, 1088, q_offset=1087, kv_offset=0)
class M(torch.nn.Module):
    is_causal = True
mod = M()
cases["hf omni_attention_forward"] = lambda: integ.omni_attention_forward(mod, q, k, v, spec, scaling=0.125)
with torch.no_grad():
    for name, fn in cases.items():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if "sdpa" in name else contextlib.nullcontext():
            print(f"host {name:28s} {host_us(fn, 1000):7.1f} us", flush=True)

# --- generate profiles
sdpa = model_with("sdpa", None)
omni = model_with("omni", sdpa.state_dict())
prompts = torch.randint(3, CONFIG["vocab_size"], (1, 1024), device="cuda")
for name, model in (("sdpa", sdpa), ("omni", omni)):
    ctx = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name == "sdpa" else contextlib.nullcontext()
    with ctx():
        generate(model, prompts, 8, disable_compile=True)
        times = [generate(model, prompts, 64, disable_compile=True)[0] for _ in range(3)]
        t1 = [generate(model, prompts, 1, disable_compile=True)[0] for _ in range(3)]
        print(f"{name}: 64 tokens {statistics.median(times)*1e3:.1f} ms, 1 token {statistics.median(t1)*1e3:.1f} ms "
              f"-> {(statistics.median(times)-statistics.median(t1))/63*1e3:.2f} ms/step", flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            generate(model, prompts, 16, disable_compile=True)
    print(f"==== {name}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))

# --- fwd+bwd host breakdown at S=512, H8, D64 fp16 causal
q2 = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True)
k2 = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True)
v2 = torch.randn(1, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True)
do2 = torch.randn_like(q2)
m2 = OmniBlockMask.causal(512)
def fb():
    out = omni_attention(q2, k2, v2, m2)
    out.backward(do2)
with torch.no_grad():
    o2, l2 = torch.ops.omni_hf.fwd.default(q2, k2, v2, *(None,) * 7, 1, 128, 128, 0, 0.125, 0.0)
cases2 = {
    "fwd+bwd omni_attention": fb,
    "fwd (grad) omni_attention": lambda: omni_attention(q2, k2, v2, m2),
    "bwd op direct": lambda: torch.ops.omni_hf.bwd.default(do2, q2, k2, v2, o2, l2, *(None,) * 7, 1, 128, 128, 0, 0.125, 0.0),
    "sdpa fa2 fwd+bwd": lambda: torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=True).backward(do2),
}
for name, fn in cases2.items():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if "sdpa" in name else contextlib.nullcontext():
        print(f"host {name:28s} {host_us(fn, 500):7.1f} us", flush=True)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        fb()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
