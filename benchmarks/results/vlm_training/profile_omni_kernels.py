"""Where a pixel step's attention time goes: one profiled training step of the VLM benchmark, the CUDA time of
omni's kernels (and of the peers' attention kernels) summed by kernel name, with the number of launches.

    python benchmarks/results/vlm_training/profile_omni_kernels.py gemma3-4b 16384 omni:sdpa flex_attention:sdpa
"""
import collections
import sys

import torch

import benchmarks.bench_vlm_training as bench

ATTENTION = ("omni", "flex", "flash", "cudnn", "fmha", "attention")
arch, length = sys.argv[1], int(sys.argv[2])
dev, dtype = torch.device("cuda"), torch.bfloat16
for spec in sys.argv[3:]:
    attn, vision = spec.split(":")
    model = bench.build_model(arch, attn, False, 0, dev, dtype, vision)
    batch, _ = bench.packed_row(model.config, length, 0, bench.REAL, dtype)
    make = bench.step_inputs(model, batch, attn, dev, True)
    opt = bench.optimizer_for(model)
    for _ in range(2):
        bench.train_step(model, opt, make(), 4096)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        bench.train_step(model, opt, make(), 4096)
        torch.cuda.synchronize()
    totals = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and any(k in e.name.lower() for k in ATTENTION):
            totals[e.name][0] += 1
            totals[e.name][1] += e.device_time_total / 1e3
    print(f"== {arch} {length} attn={attn} tower={vision}: attention-like kernels, ms (launches)")
    for name, (n, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"{ms:9.2f} ms {n:5d}  {name[:150]}")
    print(f"{sum(ms for _, ms in totals.values()):9.2f} ms in all")
    del model, opt, make, batch
    bench.free_memory()
