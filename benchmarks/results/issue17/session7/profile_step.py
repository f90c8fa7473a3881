"""Where a 16k Qwen2.5-VL-3B training step's time goes under one backend: the GPU time of each kernel over one
profiled step (after warm-up), summed by kind (attention, the rest), to set the attention share the
``no_attention`` baseline of bench_vlm_training implies beside what the attention kernels take.

    python benchmarks/results/issue17/session7/profile_step.py --attn omni --length 16384
"""

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from benchmarks import bench_vlm_training as bench  # noqa: E402

ATTENTION = ("omni", "flash", "fmha", "attention", "triton_tem")  # kernel names of omni, sdpa and flex


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="qwen2.5-vl-3b")
    parser.add_argument("--attn", default="omni")
    parser.add_argument("--length", type=int, default=16384)
    args = parser.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    model = bench.build_model(args.arch, args.attn, False, 0, device, dtype)
    batch, counts = bench.packed_row(model.config, args.length, 0, bench.REAL, dtype)
    make_inputs = bench.step_inputs(model, batch, args.attn, device)
    optimizer = bench.optimizer_for(model)
    for _ in range(2):
        bench.train_step(model, optimizer, make_inputs(), 4096)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        bench.train_step(model, optimizer, make_inputs(), 4096)
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in kernels)
    attention = [e for e in kernels if any(word in e.key.lower() for word in ATTENTION)]
    print(f"{args.arch} {args.length} {args.attn} {counts}: GPU kernels {total / 1e3:.1f} ms, attention kernels "
          f"{sum(e.self_device_time_total for e in attention) / 1e3:.1f} ms")
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:25]:
        print(f"{e.self_device_time_total / 1e3:9.2f} ms {e.count:6d}x  {e.key[:110]}")


if __name__ == "__main__":
    main()
