"""Time `OmniCollator` on one batch of ~32k tokens with 40 images of 576 tokens, block mask included.

    python -m benchmarks.bench_collator [--repeats 200]

One CPU core (``torch.set_num_threads(1)``). Prints the median time per batch and its breakdown: the
ids (everything but the block mask: reading, layout, ids, labels, positions) and
``OmniBlockMask.from_token_ids`` on the collated ids, in wall-clock and in CPU time. Target: <= 5 ms per
batch (checked on the CPU time, which a busy machine does not inflate). Token ids come as
torch tensors (as from ``datasets`` with ``with_format("torch")``) or as Python lists (slower: numpy must
convert every int).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from omni_hf import OmniBlockMask, OmniCollator

IMAGE_TOKENS = 576
IMAGES = 40
TOTAL_TOKENS = 32 * 1024


def make_samples(num_samples: int, tokens_per_sample: int, as_lists: bool, seed: int = 0) -> list[dict]:
    """``num_samples`` samples of ``tokens_per_sample`` tokens each, the 40 images spread evenly over them
    (each image after a random stretch of text), token ids as torch tensors or Python lists."""
    rng = np.random.default_rng(seed)
    images = np.bincount(np.arange(IMAGES) % num_samples, minlength=num_samples)
    samples = []
    for count in images.tolist():
        text = tokens_per_sample - count * IMAGE_TOKENS
        cuts = np.sort(rng.integers(0, text + 1, count))
        starts = cuts + np.arange(count) * IMAGE_TOKENS
        ids = rng.integers(0, 32000, tokens_per_sample)
        spans = [(int(s), int(s) + IMAGE_TOKENS) for s in starts]
        samples.append({"input_ids": ids.tolist() if as_lists else torch.from_numpy(ids),
                        "modality_spans": spans, "prompt_length": int(rng.integers(0, 16))})
    return samples


def timed_ms(fns: list[Callable[[], object]], repeats: int) -> list[tuple[float, float]]:
    """Median wall-clock and median CPU (this thread's) milliseconds of each function, timed in turn
    within every repeat so that load from other processes falls on all of them alike. On a busy machine
    the wall time counts the time other processes hold the core; the CPU time does not."""
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for repeat in range(repeats + 5):
        for fn, wall_times, cpu_times in zip(fns, wall, cpu):
            start, start_cpu = time.perf_counter(), time.thread_time()
            fn()
            if repeat >= 5:  # warm-up
                wall_times.append((time.perf_counter() - start) * 1e3)
                cpu_times.append((time.thread_time() - start_cpu) * 1e3)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(wall, cpu)]


def bench(name: str, collator_args: dict, samples: list[dict], repeats: int) -> None:
    with_mask = OmniCollator(0, return_block_mask=True, **collator_args)
    ids_only = OmniCollator(0, **collator_args)
    batch = ids_only(samples)
    doc, grp = batch["omni_doc_ids"], batch["omni_group_ids"]
    (total, total_cpu), (ids, ids_cpu), (mask, mask_cpu) = timed_ms(
        [lambda: with_mask(samples), lambda: ids_only(samples), lambda: OmniBlockMask.from_token_ids(doc, grp)],
        repeats)
    shape = "x".join(map(str, batch["input_ids"].shape))
    print(f"{name:<38} {shape:>7} | wall {total:5.2f} = {ids:5.2f} + {mask:5.2f} | cpu {total_cpu:5.2f} = "
          f"{ids_cpu:5.2f} + {mask_cpu:5.2f} | {'ok' if total_cpu <= 5 else 'OVER 5 ms'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{IMAGES} images x {IMAGE_TOKENS} tokens in {TOTAL_TOKENS} tokens, 1 thread, median ms of {args.repeats}: "
          "total (block mask included) = ids (the collator without it) + from_token_ids")
    for as_lists in (False, True):
        kind = "lists" if as_lists else "tensors"
        bench(f"pack 40 into rows of 8192, {kind}", {"mode": "pack", "max_length": 8192},
              make_samples(40, TOTAL_TOKENS // 40, as_lists), args.repeats)
        bench(f"pad 8 of 4096, {kind}", {"mode": "pad"},
              make_samples(8, TOTAL_TOKENS // 8, as_lists), args.repeats)
        bench(f"pack 40 into one row of 32768, {kind}", {"mode": "pack", "max_length": TOTAL_TOKENS},
              make_samples(40, TOTAL_TOKENS // 40, as_lists), args.repeats)


if __name__ == "__main__":
    main()
