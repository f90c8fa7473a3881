"""Context parallelism on N GPUs against one: speed, capacity, attention imbalance and exactness, in one JSON per N,
each measured figure beside the cost model's prediction.

    python -m benchmarks.bench_context_parallel --gpus 2 4 --length 98304 [--model tinyllama-1.1b] [--engine fsdp2]
                                                [--parts speed capacity] [--concurrent] [--out DIR]

Runs `examples/context_parallel.py` under torchrun: on one GPU, then on each of ``--gpus`` GPUs with ``--check``
(each rank also runs its whole row in one process: loss and gradients), all at ``--length``. Then the longest row
each trains (two steps, so that AdamW's state is there): the first try is the length that fills
``--memory-fraction`` of the GPU by the run's memory (weights, gradients and optimizer state, plus the peak's excess
over them per token), then steps up while a row fits and down while it does not (``--coarse`` tokens, doubling
each time), then bisection down to ``--resolution`` tokens (each try its own launch, so running out of memory ends
only that try; any other failure stops the benchmark). ``--concurrent`` runs the searches of several GPU counts at
once on disjoint GPUs where they fit beside each other (a search times nothing).

Every launch's result is kept in ``<out>/parts/`` and reused by a later call with the same ``--out`` (so one
benchmark can span several calls of a time-limited machine: ``--parts speed``, then ``--parts capacity``).

Writes ``context_parallel_<N>x<gpu>.json`` to ``--out`` (default $OUT, else benchmarks/results/) for each N:
``{"gpus", "gpu", "driver", "torch", "model", "seq_len", "speedup", "capacity_ratio", "imbalance",
"loss_rel_diff", "predicted", ...}`` with ``speedup`` = N-GPU tokens/s over 1-GPU tokens/s, ``capacity_ratio`` =
longest row on N GPUs over on one (``capacity_ratio_bounds``: the range the search's resolution leaves it in),
``imbalance`` = slowest rank's attention time over the ranks' mean, minus 1. ``predicted``: the cost model
(`benchmarks.context_parallel_model.predict_step`, H100 rates) on the run's first timed row and its cuts — speedup
and attention imbalance for every scheme (the run's own beside the others) — and the longest row by the one-GPU run's
memory (weights, gradients and optimizer state sharded N ways, activations per token split N ways). A short table
is printed last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "context_parallel.py"
PARTS = ("speed", "capacity")
# how the allocator, cuBLAS, NCCL and the kernels' own allocations say that the GPU is full (lower case)
OUT_OF_MEMORY = ("out of memory", "outofmemoryerror", "alloc_failed")


class OutOfMemory(Exception):
    """A launch ran out of GPU memory."""


def launch(gpus: int, length: int, args: argparse.Namespace, *extra: str, devices: str | None = None) -> dict:
    """One torchrun of the example on ``gpus`` GPUs (``devices``: which, as CUDA_VISIBLE_DEVICES; default the first
    ones); its JSON. Raises `OutOfMemory` where a rank ran out of memory, RuntimeError on any other failure (with
    the log's tail)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                   str(EXAMPLE), "--device", "cuda", "--model", args.model, "--engine", args.engine, "--length",
                   str(length), "--json", str(out), *extra]
        env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": devices} if devices else {}))
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        took = f"{time.perf_counter() - start:.0f} s" + (f", GPUs {devices}" if devices else "")
        if done.returncode == 0 and out.is_file():
            print(f"$ {' '.join(command[2:])}  ({took})", flush=True)
            return json.loads(out.read_text())
        log = done.stdout + done.stderr
        if any(sign in log.lower() for sign in OUT_OF_MEMORY):
            print(f"$ {' '.join(command[2:])}  ({took}): out of memory", flush=True)
            raise OutOfMemory(length)
        errors = [line for line in log.splitlines() if "Error" in line][-5:]
        raise RuntimeError(f"{' '.join(command[2:])} failed ({done.returncode}):\n" + "\n".join(
            log.splitlines()[-60:] + ["errors:", *errors]))


def first_guess(run: dict, fraction: float, step: int, memory_gib: float | None = None) -> int:
    """The length whose memory fills ``fraction`` of a GPU of ``memory_gib`` (default ``run``'s) by ``run``'s: fixed
    memory plus a per-token share."""
    static = max(run["per_rank"]["static_memory_gib"])
    per_token = (max(run["per_rank"]["peak_memory_gib"]) - static) / run["seq_len"]
    length = (fraction * (memory_gib or run["memory_gib"]) - static) / per_token
    return max(step, int(length // step) * step)


def fits(gpus: int, length: int, args: argparse.Namespace, devices: str | None = None) -> bool:
    """Whether two training steps of a ``length``-token row run on ``gpus`` GPUs (the second holds AdamW's state,
    which the first creates only after its backward)."""
    try:
        launch(gpus, length, args, "--warmup", "1", "--steps", "1", "--workers", "1", devices=devices)
        return True
    except OutOfMemory:
        return False


def longest_row(gpus: int, guess: int, args: argparse.Namespace, devices: str | None = None) -> dict:
    """The longest row that trains on ``gpus`` GPUs: from ``guess``, steps up or down (``--coarse`` tokens, doubling
    after each step that does not bracket the limit) until one fits and a longer one does not, then bisection down to
    ``--resolution``. Returns the longest that fit, the shortest that did not, and every try."""
    tries = []

    def attempt(length: int) -> bool:
        tries.append({"length": length, "fits": fits(gpus, length, args, devices)})
        return tries[-1]["fits"]

    fit, fail = (guess, None) if attempt(guess) else (None, guess)
    step = args.coarse
    while fail is None:
        fit, fail = (fit + step, None) if attempt(fit + step) else (fit, fit + step)
        step *= 2
    while fit is None:
        if fail <= args.resolution:
            return {"longest": 0, "shortest_failing": fail, "tries": tries}
        shorter = max(args.resolution, fail - step)
        fit, fail = (shorter, fail) if attempt(shorter) else (None, shorter)
        step *= 2
    while fail - fit > args.resolution:
        middle = (fit + fail) // 2 // args.resolution * args.resolution
        fit, fail = (middle, fail) if attempt(middle) else (fit, middle)
    return {"longest": fit, "shortest_failing": fail, "tries": tries}


def waves(counts: list[int], visible: int) -> list[list[tuple[int, str]]]:
    """GPU counts grouped into waves that run at once on disjoint GPUs, each count with its CUDA_VISIBLE_DEVICES:
    the largest first, then as many smaller ones as fit beside it."""
    left, plan = sorted(counts, reverse=True), []
    while left:
        wave, used = [], 0
        for count in list(left):
            if used + count <= visible:
                wave.append((count, ",".join(map(str, range(used, used + count)))))
                used += count
                left.remove(count)
        plan.append(wave)
    return plan


class Parts:
    """Launch results kept as JSON in ``folder`` and reused when asked for again."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def get(self, name: str, make) -> dict:
        path = self.folder / f"{name}.json"
        if path.is_file():
            print(f"reusing {path}", flush=True)
            return json.loads(path.read_text())
        value = make()
        path.write_text(json.dumps(value, indent=1) + "\n")
        return value

    def has(self, name: str) -> bool:
        return (self.folder / f"{name}.json").is_file()


def searches(counts: list[int], speed: dict, args: argparse.Namespace, parts: Parts) -> dict:
    """``{count: longest_row(...)}`` for each GPU count, by waves on disjoint GPUs under ``--concurrent``."""
    found, todo = {}, [count for count in counts if not parts.has(f"longest_row_{count}")]
    for count in set(counts) - set(todo):
        found[count] = parts.get(f"longest_row_{count}", None)

    def search(count: int, devices: str | None) -> None:
        guess = first_guess(speed[count], args.memory_fraction, args.coarse, gpu_memory_gib())
        found[count] = parts.get(f"longest_row_{count}", lambda: longest_row(count, guess, args, devices))

    plan = waves(todo, visible_gpus()) if args.concurrent else [[(count, None)] for count in todo]
    for wave in plan[::-1]:  # the smaller counts first: the largest, alone, takes the longest rows
        threads = [threading.Thread(target=search, args=job) for job in wave]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        missing = [count for count, _ in wave if count not in found]
        if missing:
            raise RuntimeError(f"the longest-row search on {missing} GPUs failed (its error is printed above)")
    return found


def gpu_names() -> list[str]:
    """The names of the visible GPUs, as torch gives them."""
    return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                          check=True).stdout.strip().splitlines()


def gpu_memory_gib() -> float:
    """The first visible GPU's memory."""
    return int(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, check=True).stdout.split()[0]) / 1024


def visible_gpus() -> int:
    return len(gpu_names())


def predictions(run: dict, one: dict, args: argparse.Namespace, memory_gib: float | None = None) -> dict:
    """The cost model on ``run``'s first timed row with its cuts: speedup over one GPU and attention imbalance per
    scheme; and the longest row by ``one``'s memory with weights, gradients and optimizer state (FSDP2) and the
    activations per token split over the GPUs, on a GPU of ``memory_gib`` (default ``one``'s)."""
    from transformers import LlamaConfig

    from benchmarks.context_parallel_model import SCHEMES, Hardware, ModelSizes, predict_step
    from omni_hf import OmniCollator

    example = importlib.util.spec_from_file_location("context_parallel_example", EXAMPLE)
    module = importlib.util.module_from_spec(example)
    example.loader.exec_module(module)
    config = LlamaConfig(**module.MODELS[args.model])
    rows = module.SyntheticRows(args.length, config.vocab_size, rows=args.warmup + 1)
    pack = OmniCollator(pad_token_id=0, mode="pack", max_length=args.length, pad_to_multiple_of=args.length)
    batch = pack(rows[args.warmup])  # the first timed row, whose cuts the run recorded
    doc, grp = (batch[key][0].numpy() for key in ("omni_doc_ids", "omni_group_ids"))
    bounds = np.concatenate([[0], np.cumsum(run["per_rank"]["tokens"])]).tolist()
    sizes, hardware = ModelSizes.from_config(config, args.model), Hardware()
    recompute = run.get("checkpointing", True)
    alone = predict_step(sizes, doc, grp, 1, "all_gather", hardware, recompute).step_s
    schemes = {}
    for scheme in SCHEMES:
        step = predict_step(sizes, doc, grp, bounds if scheme != "ulysses" else run["gpus"], scheme, hardware,
                            recompute)
        schemes[scheme] = {"speedup": alone / step.step_s,
                           "imbalance": float(step.attention_s.max() / step.attention_s.mean() - 1)}
    ran = run.get("schedule", "all_gather")  # results of the first design carry no schedule
    static = max(one["per_rank"]["static_memory_gib"])  # the activations' per-token share cancels in the ratio
    usable = args.memory_fraction * (memory_gib or one["memory_gib"])
    return {"schemes": schemes, "speedup": schemes[ran]["speedup"], "imbalance": schemes[ran]["imbalance"],
            "capacity_ratio": (usable - static / run["gpus"]) * run["gpus"] / (usable - static),
            "how": "cost model (predict_step, Hardware() H100 rates, recompute as the run) on the first timed row "
                   "with the run's cuts, for the run's schedule; capacity by the one-GPU run's memory: static / N + "
                   "per-token activations over N"}


def driver_version() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report(count: int, speed: dict, found: dict, searched_on: dict | None, args: argparse.Namespace) -> dict:
    """The JSON of ``count`` GPUs against one: ``speed`` and ``found`` (the longest-row searches) by GPU count,
    ``searched_on`` the GPU of the searches (``{"gpu", "memory_gib"}``)."""
    one, many = speed[1], speed[count]
    result = {"gpus": count, "gpu": many["gpu"], "driver": driver_version(), "torch": many["torch"],
              "model": args.model, "engine": args.engine, "seq_len": args.length,
              "speedup": many["tokens_per_s"] / one["tokens_per_s"], "capacity_ratio": None,
              "imbalance": many["imbalance"], "loss_rel_diff": many["loss_rel_diff"],
              "grad_rel_diff": many["grad_rel_diff"], "grad_noise": many["grad_noise"],
              "tokens_per_s": {"1": one["tokens_per_s"], str(count): many["tokens_per_s"]},
              "predicted": predictions(many, one, args, searched_on and searched_on["memory_gib"]),
              "runs": {"1": one, str(count): many},
              "command": "python -m benchmarks.bench_context_parallel " + " ".join(sys.argv[1:])}
    if 1 in found and count in found:
        single, several = found[1], found[count]
        result["longest_row"] = {"1": single, str(count): several, "gpu": searched_on["gpu"]}
        if single["longest"]:
            result["capacity_ratio"] = several["longest"] / single["longest"]
            # the true longest rows lie in [longest, shortest_failing): so does their ratio, within these bounds
            result["capacity_ratio_bounds"] = [several["longest"] / single["shortest_failing"],
                                               several["shortest_failing"] / single["longest"]]
    return result


def table_row(result: dict) -> str:
    count, predicted = result["gpus"], result["predicted"]
    longest = {gpus: search["longest"] for gpus, search in result.get("longest_row", {}).items() if gpus != "gpu"}
    capacity = f"{result['capacity_ratio']:.2f}x" if result["capacity_ratio"] else "-"
    return (f"| {count} | {result['tokens_per_s'][str(count)]:,.0f} | {result['speedup']:.2f}x "
            f"({predicted['speedup']:.2f}x) | {longest.get('1')} / {longest.get(str(count))} | {capacity} "
            f"({predicted['capacity_ratio']:.2f}x) | {result['imbalance']:.1%} ({predicted['imbalance']:.1%}) | "
            f"{result['loss_rel_diff']:.1e} | {result['grad_rel_diff']:.1e} ({result['grad_noise']:.1e}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[2], help="GPU counts to set against one")
    parser.add_argument("--length", type=int, default=65536, help="row length of the speed runs")
    parser.add_argument("--model", default="tinyllama-1.1b")
    parser.add_argument("--engine", default="fsdp2", choices=("fsdp2", "ddp"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--coarse", type=int, default=16384, help="first steps of the longest-row search")
    parser.add_argument("--resolution", type=int, default=2048, help="where the longest-row search stops")
    parser.add_argument("--memory-fraction", type=float, default=0.92, help="of the GPU, for the search's first try")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what this call measures")
    parser.add_argument("--concurrent", action="store_true", help="searches of several GPU counts at once")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else benchmarks/results/")
    args = parser.parse_args()
    if any(count < 2 for count in args.gpus):
        parser.error(f"--gpus: expected counts of 2 or more GPUs, got {args.gpus}")

    out = args.out or Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    parts = Parts(out / "parts" / f"{args.model}_{args.engine}_{args.length}")
    timing = ("--steps", str(args.steps), "--warmup", str(args.warmup))
    counts = [1, *args.gpus]
    if "speed" not in args.parts and not all(parts.has(f"speed_{count}") for count in counts):
        parser.error(f"--parts capacity needs the speed runs of {counts} GPUs in {parts.folder}: run --parts speed")
    speed = {count: parts.get(f"speed_{count}", lambda count=count: launch(
        count, args.length, args, *timing, *(("--check",) if count > 1 else ()))) for count in counts}
    if "capacity" in args.parts:
        capacity_gpu = parts.get("capacity_gpu", lambda: {"gpu": gpu_names()[0], "memory_gib": gpu_memory_gib()})
        if capacity_gpu["gpu"] != gpu_names()[0]:
            raise SystemExit(f"--parts capacity: {parts.folder} holds searches on {capacity_gpu['gpu']}, this machine "
                             f"has {gpu_names()[0]}: longest rows compare only on one kind of GPU")
    found = searches(counts, speed, args, parts) if "capacity" in args.parts else {
        count: parts.get(f"longest_row_{count}", None) for count in counts if parts.has(f"longest_row_{count}")}
    searched_on = parts.get("capacity_gpu", None) if found else None  # may be another kind than the speed runs'

    results = [report(count, speed, found, searched_on, args) for count in args.gpus]
    for result in results:
        path = out / f"context_parallel_{result['gpus']}x{result['gpu'].split()[1].lower()}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{args.model}, {args.engine}, {results[0]['gpu']}, rows of {args.length} tokens; (predicted)")
    print("| GPUs | tokens/s | speedup over 1 GPU | longest row 1 / N | capacity | attention imbalance | "
          "loss rel. diff | grad rel. diff (noise) |")
    print(f"| 1 | {speed[1]['tokens_per_s']:,.0f} | | | | | | |")
    for result in results:
        print(table_row(result))


if __name__ == "__main__":
    main()
