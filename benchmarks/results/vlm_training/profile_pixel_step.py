"""Profile one pixel step of the VLM benchmark per backend: the top CUDA kernels (with the step's and the tower's
times); with --attention-kernels the CUDA time of omni's and the peers' attention kernels summed by name; with
--kernel-diff every kernel's time summed by name, then the kernels whose time differs most between the first row
(e.g. ``no_attention:sdpa``) and each other row: where a backend's step time goes beyond the baseline's.

    python benchmarks/results/vlm_training/profile_pixel_step.py [--attention-kernels | --kernel-diff] ARCH LENGTH ATTN:TOWER ...
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


def kernel_totals(prof) -> dict[str, list]:
    """[launches, ms] of every CUDA kernel and memcpy / memset of the profile, by name."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name][0] += 1
            totals[e.name][1] += e.device_time_total / 1e3
    return totals


def kernel_diff(base: tuple[str, dict], other: tuple[str, dict], rows: int = 25) -> None:
    """The kernels whose summed time differs most between two profiled steps."""
    (base_name, a), (name, b) = base, other
    total_a, total_b = (sum(ms for _, ms in t.values()) for t in (a, b))
    print(f"== {name} against {base_name}: CUDA time {total_b:.1f} ms against {total_a:.1f} ms "
          f"({total_b - total_a:+.1f} ms); kernels by difference, ms (launches)")
    for k in sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, [0, 0.0])[1] - a.get(k, [0, 0.0])[1]))[:rows]:
        (na, ma), (nb, mb) = a.get(k, [0, 0.0]), b.get(k, [0, 0.0])
        print(f"{mb - ma:+9.2f}  {ma:8.2f} ({na:4d}) -> {mb:8.2f} ({nb:4d})  {k[:120]}")


def main(argv: list[str]) -> None:
    mode = argv[0] if argv[0] in ("--attention-kernels", "--kernel-diff") else None
    by_attention, diff = mode == "--attention-kernels", mode == "--kernel-diff"
    arch, length, *rows = argv[1:] if mode else argv
    profiles = []
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
        if not by_attention:  # an unprofiled step, and (without --kernel-diff) the tower alone
            t = time.perf_counter()
            bench.train_step(model, opt, make(), 4096)
            torch.cuda.synchronize()
            header += f": step {(time.perf_counter() - t) * 1e3:.0f} ms"
        if not mode:
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
            header += f", tower alone {tower * 1e3:.0f} ms, pixel_values {tuple(batch['pixel_values'].shape)}"
        print(header)
        activities = [torch.profiler.ProfilerActivity.CUDA] + ([] if mode else [torch.profiler.ProfilerActivity.CPU])
        with torch.profiler.profile(activities=activities) as prof:
            bench.train_step(model, opt, make(), 4096)
            torch.cuda.synchronize()
        if diff:
            profiles.append((spec, kernel_totals(prof)))
        else:
            (attention_kernels if by_attention else top_kernels)(prof)
        del model, opt, make, batch, prof
        bench.free_memory()
    for other in profiles[1:]:
        kernel_diff(profiles[0], other)


if __name__ == "__main__":
    main(sys.argv[1:])
