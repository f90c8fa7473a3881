"""Context parallelism on N GPUs against one: speed, capacity, attention imbalance and exactness, in one JSON.

    python -m benchmarks.bench_context_parallel --gpus 2 --length 65536 [--model tinyllama-1.1b] [--engine fsdp2]

Runs `examples/context_parallel.py` under torchrun: on one GPU, then on ``--gpus`` GPUs with ``--check`` (each
rank also runs its whole row in one process: loss and gradients), both at ``--length``. Then the longest row each
trains (one step): the first try is the length that fills ``--memory-fraction`` of the GPU by the run's memory
(weights and optimizer state, plus the peak's excess over them per token), then steps of ``--resolution`` tokens up
while a step fits and down while it does not (each try its own launch, so running out of memory ends only that
try). Writes ``context_parallel_<gpus>x<gpu>.json`` to ``--out`` (default $OUT, else benchmarks/results/):
``{"gpus", "gpu", "driver", "torch", "model", "seq_len", "speedup", "capacity_ratio", "imbalance", "loss_rel_diff",
...}`` with ``speedup`` = N-GPU tokens/s over 1-GPU tokens/s, ``capacity_ratio`` = longest row on N GPUs over on one,
``imbalance`` = slowest rank's attention time over the ranks' mean, minus 1. A short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "context_parallel.py"


def launch(gpus: int, length: int, args: argparse.Namespace, *extra: str) -> dict | None:
    """One torchrun of the example; its JSON, or None where it failed (out of memory)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                   str(EXAMPLE), "--device", "cuda", "--model", args.model, "--engine", args.engine, "--length",
                   str(length), "--json", str(out), *extra]
        print("$", " ".join(command[2:]), flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stdout + done.stderr).strip().splitlines()
            memory = any("OutOfMemoryError" in line or "out of memory" in line for line in tail)
            print(f"  failed ({'out of memory' if memory else 'see the log'}): {tail[-1] if tail else ''}", flush=True)
            if not memory:
                print("\n".join(tail[-40:]), flush=True)
            return None
        return json.loads(out.read_text())


def first_guess(run: dict, fraction: float, resolution: int) -> int:
    """The length whose memory fills ``fraction`` of the GPU by ``run``'s: fixed memory plus a per-token share."""
    static = max(run["per_rank"]["static_memory_gib"])
    per_token = (max(run["per_rank"]["peak_memory_gib"]) - static) / run["seq_len"]
    length = (fraction * run["memory_gib"] - static) / per_token
    return max(resolution, int(length // resolution) * resolution)


def longest_row(gpus: int, guess: int, args: argparse.Namespace) -> tuple[int, list[dict]]:
    """The longest row (a multiple of ``--resolution``) whose step trains on ``gpus`` GPUs, and every try."""
    tries, fits = [], {}
    length = guess
    while len(tries) < args.max_tries:
        result = launch(gpus, length, args, "--steps", "1", "--warmup", "0", "--workers", "1")
        fits[length] = result is not None
        tries.append({"length": length, "fits": fits[length]})
        step = args.resolution if fits[length] else -args.resolution
        if length + step in fits or length + step <= 0:
            break
        length += step
    fitting = [length for length, ok in fits.items() if ok]
    return (max(fitting) if fitting else 0), tries


def driver_version() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.splitlines()[0].strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--length", type=int, default=65536, help="row length of the speed runs")
    parser.add_argument("--model", default="tinyllama-1.1b")
    parser.add_argument("--engine", default="fsdp2", choices=("fsdp2", "ddp"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--resolution", type=int, default=16384, help="granularity of the longest-row search")
    parser.add_argument("--memory-fraction", type=float, default=0.92, help="of the GPU, for the search's first try")
    parser.add_argument("--max-tries", type=int, default=5, help="launches per longest-row search")
    parser.add_argument("--no-capacity", action="store_true", help="skip the longest-row searches")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else benchmarks/results/")
    args = parser.parse_args()

    timing = ("--steps", str(args.steps), "--warmup", str(args.warmup))
    one = launch(1, args.length, args, *timing)
    many = launch(args.gpus, args.length, args, *timing, "--check")
    if one is None or many is None:
        raise SystemExit("a speed run failed (see above)")
    result = {"gpus": args.gpus, "gpu": many["gpu"], "driver": driver_version(), "torch": many["torch"],
              "model": args.model, "engine": args.engine, "seq_len": args.length,
              "speedup": many["tokens_per_s"] / one["tokens_per_s"], "capacity_ratio": None,
              "imbalance": many["imbalance"], "loss_rel_diff": many["loss_rel_diff"],
              "grad_rel_diff": many["grad_rel_diff"], "tokens_per_s": {"1": one["tokens_per_s"],
                                                                       str(args.gpus): many["tokens_per_s"]},
              "runs": {"1": one, str(args.gpus): many},
              "command": "python -m benchmarks.bench_context_parallel " + " ".join(sys.argv[1:])}
    if not args.no_capacity:
        longest = {}
        for gpus, run in ((1, one), (args.gpus, many)):
            longest[str(gpus)], result[f"capacity_tries_{gpus}"] = longest_row(
                gpus, first_guess(run, args.memory_fraction, args.resolution), args)
        result["longest_row"] = longest
        result["capacity_ratio"] = longest[str(args.gpus)] / longest["1"] if longest["1"] else None
    out = args.out or Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"context_parallel_{args.gpus}x{result['gpu'].split()[1].lower()}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{args.model}, {args.engine}, {args.gpus} x {result['gpu']}, rows of {args.length} tokens ({path.name})")
    print(f"| tokens/s 1 GPU | tokens/s {args.gpus} GPUs | speedup | longest row 1 / {args.gpus} | capacity | "
          "attention imbalance | loss rel. diff | grad rel. diff |")
    longest = result.get("longest_row", {})
    print(f"| {one['tokens_per_s']:,.0f} | {many['tokens_per_s']:,.0f} | {result['speedup']:.2f}x | "
          f"{longest.get('1')} / {longest.get(str(args.gpus))} | {result['capacity_ratio']} | "
          f"{result['imbalance']:.1%} | {result['loss_rel_diff']:.1e} | {result['grad_rel_diff']:.1e} |")


if __name__ == "__main__":
    main()
