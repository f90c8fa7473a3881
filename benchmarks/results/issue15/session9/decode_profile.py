"""Session 9 diagnostics: eager decoding at batch 1 and 8, omni vs sdpa-FA2: ms per step and where it goes."""
import contextlib, os, statistics, sys
sys.path.insert(0, os.getcwd())
import torch
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import SDPBackend, sdpa_kernel
from benchmarks.bench_decode import CONFIG, model_with, generate

sdpa = model_with("sdpa", None)
omni = model_with("omni", sdpa.state_dict())
for batch in (1, 8):
    prompts = torch.randint(3, CONFIG["vocab_size"], (batch, 1024), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(batch))
    steps = {}
    for rnd in range(4):
        for name, model in (("sdpa", sdpa), ("omni", omni)):
            ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name == "sdpa" else contextlib.nullcontext()
            with ctx:
                t64 = generate(model, prompts, 64, disable_compile=True)[0]
                t1 = generate(model, prompts, 1, disable_compile=True)[0]
            if rnd:
                steps.setdefault(name, []).append(((t64 - t1) / 63 * 1e3, t1 * 1e3))
    for name, v in steps.items():
        print(f"batch {batch} {name}: ms/step {statistics.median(x for x, _ in v):.2f}, prefill+1 {statistics.median(y for _, y in v):.1f} ms", flush=True)
    for name, model in (("sdpa", sdpa), ("omni", omni)):
        ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name == "sdpa" else contextlib.nullcontext()
        with ctx:
            generate(model, prompts, 4, disable_compile=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                generate(model, prompts, 16, disable_compile=True)
        print(f"==== batch {batch} {name}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=50))
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=50))
