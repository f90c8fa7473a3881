"""Where eager decoding's tokens/s goes, omni against SDPA-FA2 with an SDPA control: `bench_decode`'s ~1B Llama,
1024-token prompts, 64 new tokens, batch 1 and 8, the three in rotated turns. A logits processor stamps the host
clock at every step, so each generate splits into its prompt (up to the first stamp), its steps (median, mean, the
slowest, and how many took over twice the median) and Python's garbage collections (count and time).

    python benchmarks/results/decode/decode_step_stamps.py [ROUNDS]   (default 8)
"""
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.getcwd())

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from benchmarks.bench_decode import eager_context, model_pair, random_prompts


class Stamps(LogitsProcessor):
    """Records the host clock at each step."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


class GcClock:
    """Counts Python's garbage collections and their time while installed."""

    def __init__(self):
        self.count, self.seconds, self._start = 0, 0.0, 0.0

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.count, self.seconds = self.count + 1, self.seconds + time.perf_counter() - self._start


def stamped_generate(model, prompts, new):
    stamps, clock = Stamps(), GcClock()
    gc.callbacks.append(clock)
    try:
        with eager_context(model), torch.no_grad():
            torch.cuda.synchronize()
            start = time.perf_counter()
            model.generate(prompts, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(prompts), logits_processor=LogitsProcessorList([stamps]),
                           disable_compile=True)
            torch.cuda.synchronize()
            end = time.perf_counter()
    finally:
        gc.callbacks.remove(clock)
    steps = [b - a for a, b in zip(stamps.times, stamps.times[1:])]
    return {"total": end - start, "prompt": stamps.times[0] - start, "steps": steps, "gc": clock.count,
            "gc_s": clock.seconds}


if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    new = 64
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    sdpa, omni = model_pair()
    for batch in (1, 8):
        prompts = random_prompts(batch, 1024)
        runs = {"sdpa": sdpa, "omni": omni, "sdpa_again": sdpa}
        names, results = list(runs), {name: [] for name in runs}
        for rnd in range(rounds + 1):  # round 0 warms up
            for name in names[rnd % 3:] + names[:rnd % 3]:
                result = stamped_generate(runs[name], prompts, new)
                if rnd:
                    results[name].append(result)
        for name, rs in results.items():
            steps = [s for r in rs for s in r["steps"]]
            median = statistics.median(steps)
            print(f"batch {batch} {name:10s}: total {statistics.median(r['total'] for r in rs) * 1e3:7.1f} ms, prompt "
                  f"{statistics.median(r['prompt'] for r in rs) * 1e3:5.1f} ms, step median {median * 1e3:.3f} mean "
                  f"{statistics.mean(steps) * 1e3:.3f} max {max(steps) * 1e3:.1f} ms, steps > 2x median "
                  f"{sum(s > 2 * median for s in steps)} of {len(steps)}, gc {sum(r['gc'] for r in rs)} collections "
                  f"{sum(r['gc_s'] for r in rs) * 1e3:.1f} ms", flush=True)
