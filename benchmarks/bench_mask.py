"""Time `OmniBlockMask.from_token_ids` on a packed VLM layout (target: <= 2 ms on one CPU thread, <= 0.2 ms on a GPU).

    python -m benchmarks.bench_mask [--seq-len 32768] [--device cpu|cuda] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.layouts import vlm_ids
from omni_hf import OmniBlockMask


def time_build(doc, grp, repeats: int) -> list[float]:
    """Milliseconds of each build, after warm-up; CUDA builds timed with events."""
    for _ in range(5):
        OmniBlockMask.from_token_ids(doc, grp)
    times = []
    for _ in range(repeats):
        if doc.is_cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            OmniBlockMask.from_token_ids(doc, grp)
            stop.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            begin = time.perf_counter()
            OmniBlockMask.from_token_ids(doc, grp)
            times.append((time.perf_counter() - begin) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    doc, grp = (torch.from_numpy(ids)[None].to(args.device) for ids in vlm_ids(args.seq_len))
    times = time_build(doc, grp, args.repeats)
    mask = OmniBlockMask.from_token_ids(doc, grp)
    types, _ = mask.block_table()
    counts = {name: int((types == value).sum()) for name, value in (("F", 1), ("C", 2), ("P", 3))}
    print(f"from_token_ids S={args.seq_len} device={args.device} threads={torch.get_num_threads()}: "
          f"median {statistics.median(times):.3f} ms, min {min(times):.3f} ms over {args.repeats}; blocks {counts}")


if __name__ == "__main__":
    main()
