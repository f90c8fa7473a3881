"""Profile one pixel step of the VLM benchmark per backend: the top CUDA kernels (with the step's and the tower's
times), or with --attention-kernels the CUDA time of omni's and the peers' attention kernels summed by name.

    python benchmarks/results/vlm_training/profile_pixel_step.py [--attention-kernels] ARCH LENGTH ATTN:TOWER ...
"""
import collections
import os
import sys
import time

import torch

os.environ.setdefault("OMNI_HF_BACKEND", "cuda")
import benchmarks.bench_vlm_training as bench  # noqa: E402

ATTENTION = ("omni", "flex", "flash", "cudnn", "fmha", "attention")


def top_kernels(prof) -> None:
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=22, max_name_column_width=100))


def attention_kernels(prof) -> None:
    totals = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and any(k in e.name.lower() for k in ATTENTION):
            totals[e.name][0] += 1
            totals[e.name][1] += e.device_time_total / 1e3
    print("attention-like kernels, ms (launches)")
    for name, (n, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"{ms:9.2f} ms {n:5d}  {name[:150]}")
    print(f"{sum(ms for _, ms in totals.values()):9.2f} ms in all")


def main(argv: list[str]) -> None:
    by_attention = argv[0] == "--attention-kernels"
    arch, length, *rows = argv[1:] if by_attention else argv
    length = int(length)
    dev, dtype = torch.device("cuda"), torch.bfloat16
    for spec in rows:
        attn, vision = spec.split(":")
        model = bench.build_model(arch, attn, False, 0, dev, dtype, vision)
        batch, _ = bench.packed_row(model.config, length, 0, bench.REAL, dtype)
        make = bench.step_inputs(model, batch, attn, dev, True)
        opt = bench.optimizer_for(model)
        for _ in range(2):
            bench.train_step(model, opt, make(), 4096)
        torch.cuda.synchronize()
        header = f"== {arch} {length} attn={attn} tower={vision}"
        if not by_attention:  # the tower alone, and an unprofiled step
            pix = {k: batch[k].to(dev) for k in ("pixel_values", "image_grid_thw") if k in batch}
            with torch.no_grad():
                for _ in range(2):
                    model.model.get_image_features(**pix)
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(3):
                    model.model.get_image_features(**pix)
                torch.cuda.synchronize()
                tower = (time.perf_counter() - t) / 3
            t = time.perf_counter()
            bench.train_step(model, opt, make(), 4096)
            torch.cuda.synchronize()
            step = time.perf_counter() - t
            header += (f": step {step * 1e3:.0f} ms, tower alone {tower * 1e3:.0f} ms, pixel_values "
                       f"{tuple(batch['pixel_values'].shape)}")
        print(header)
        activities = [torch.profiler.ProfilerActivity.CUDA] + ([] if by_attention else [torch.profiler.ProfilerActivity.CPU])
        with torch.profiler.profile(activities=activities) as prof:
            bench.train_step(model, opt, make(), 4096)
            torch.cuda.synchronize()
        (attention_kernels if by_attention else top_kernels)(prof)
        del model, opt, make, batch
        bench.free_memory()


if __name__ == "__main__":
    main(sys.argv[1:])
