"""Context parallelism on N GPUs against one: speed, capacity, attention imbalance and exactness, in one JSON.

    python -m benchmarks.bench_context_parallel --gpus 2 --length 65536 [--model tinyllama-1.1b] [--engine fsdp2]

Runs `examples/context_parallel.py` under torchrun: on one GPU, then on ``--gpus`` GPUs with ``--check`` (each
rank also runs its whole row in one process: loss and gradients), both at ``--length``. Then the longest row each
trains (two steps, so that AdamW's state is there): the first try is the length that fills ``--memory-fraction`` of
the GPU by the run's memory (weights, gradients and optimizer state, plus the peak's excess over them per token),
then steps of ``--coarse`` tokens up while a row fits and down while it does not, then bisection down to
``--resolution`` tokens (each try its own launch, so running out of memory ends only that try; any other failure
stops the benchmark). Writes ``context_parallel_<gpus>x<gpu>.json`` to ``--out`` (default $OUT, else
benchmarks/results/): ``{"gpus", "gpu", "driver", "torch", "model", "seq_len", "speedup", "capacity_ratio",
"imbalance", "loss_rel_diff", ...}`` with ``speedup`` = N-GPU tokens/s over 1-GPU tokens/s, ``capacity_ratio`` =
longest row on N GPUs over on one (``capacity_ratio_bounds``: the range the search's resolution leaves it in),
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


class OutOfMemory(Exception):
    """A launch ran out of GPU memory."""


def launch(gpus: int, length: int, args: argparse.Namespace, *extra: str) -> dict:
    """One torchrun of the example; its JSON. Raises `OutOfMemory` where a rank ran out of memory, RuntimeError on any
    other failure (with the log's tail)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                   str(EXAMPLE), "--device", "cuda", "--model", args.model, "--engine", args.engine, "--length",
                   str(length), "--json", str(out), *extra]
        print("$", " ".join(command[2:]), flush=True)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0 and out.is_file():
            return json.loads(out.read_text())
        log = done.stdout + done.stderr
        if "OutOfMemoryError" in log or "CUDA out of memory" in log:
            print("  out of memory", flush=True)
            raise OutOfMemory(length)
        raise RuntimeError(f"{' '.join(command[2:])} failed ({done.returncode}):\n" + "\n".join(log.splitlines()[-40:]))


def first_guess(run: dict, fraction: float, step: int) -> int:
    """The length whose memory fills ``fraction`` of the GPU by ``run``'s: fixed memory plus a per-token share."""
    static = max(run["per_rank"]["static_memory_gib"])
    per_token = (max(run["per_rank"]["peak_memory_gib"]) - static) / run["seq_len"]
    length = (fraction * run["memory_gib"] - static) / per_token
    return max(step, int(length // step) * step)


def fits(gpus: int, length: int, args: argparse.Namespace) -> bool:
    """Whether two training steps of a ``length``-token row run on ``gpus`` GPUs (the second holds AdamW's state,
    which the first creates only after its backward)."""
    try:
        launch(gpus, length, args, "--warmup", "1", "--steps", "1", "--workers", "1")
        return True
    except OutOfMemory:
        return False


def longest_row(gpus: int, guess: int, args: argparse.Namespace) -> dict:
    """The longest row that trains on ``gpus`` GPUs: from ``guess``, steps of ``--coarse`` tokens up or down until
    one fits and the next does not, then bisection down to ``--resolution``. Returns the longest that fit, the
    shortest that did not, and every try."""
    tries = []

    def attempt(length: int) -> bool:
        tries.append({"length": length, "fits": fits(gpus, length, args)})
        return tries[-1]["fits"]

    fit, fail = (guess, None) if attempt(guess) else (None, guess)
    while fail is None:
        fit, fail = (fit + args.coarse, None) if attempt(fit + args.coarse) else (fit, fit + args.coarse)
    while fit is None:
        if fail - args.coarse <= 0:
            return {"longest": 0, "shortest_failing": fail, "tries": tries}
        fit, fail = (fail - args.coarse, fail) if attempt(fail - args.coarse) else (None, fail - args.coarse)
    while fail - fit > args.resolution:
        middle = (fit + fail) // 2 // args.resolution * args.resolution
        fit, fail = (middle, fail) if attempt(middle) else (fit, middle)
    return {"longest": fit, "shortest_failing": fail, "tries": tries}


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
    parser.add_argument("--coarse", type=int, default=16384, help="first steps of the longest-row search")
    parser.add_argument("--resolution", type=int, default=2048, help="where the longest-row search stops")
    parser.add_argument("--memory-fraction", type=float, default=0.92, help="of the GPU, for the search's first try")
    parser.add_argument("--no-capacity", action="store_true", help="skip the longest-row searches")
    parser.add_argument("--out", type=Path, default=None, help="default: $OUT, else benchmarks/results/")
    args = parser.parse_args()

    timing = ("--steps", str(args.steps), "--warmup", str(args.warmup))
    one = launch(1, args.length, args, *timing)
    many = launch(args.gpus, args.length, args, *timing, "--check")
    result = {"gpus": args.gpus, "gpu": many["gpu"], "driver": driver_version(), "torch": many["torch"],
              "model": args.model, "engine": args.engine, "seq_len": args.length,
              "speedup": many["tokens_per_s"] / one["tokens_per_s"], "capacity_ratio": None,
              "imbalance": many["imbalance"], "loss_rel_diff": many["loss_rel_diff"],
              "grad_rel_diff": many["grad_rel_diff"], "grad_noise": many["grad_noise"],
              "tokens_per_s": {"1": one["tokens_per_s"], str(args.gpus): many["tokens_per_s"]},
              "runs": {"1": one, str(args.gpus): many},
              "command": "python -m benchmarks.bench_context_parallel " + " ".join(sys.argv[1:])}
    if not args.no_capacity:
        searches = {str(gpus): longest_row(gpus, first_guess(run, args.memory_fraction, args.coarse), args)
                    for gpus, run in ((1, one), (args.gpus, many))}
        single, several = searches["1"], searches[str(args.gpus)]
        result["longest_row"] = searches
        if single["longest"]:
            result["capacity_ratio"] = several["longest"] / single["longest"]
            # the true longest rows lie in [longest, shortest_failing): so does their ratio, within these bounds
            result["capacity_ratio_bounds"] = [several["longest"] / single["shortest_failing"],
                                               several["shortest_failing"] / single["longest"]]
    out = args.out or Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"context_parallel_{args.gpus}x{result['gpu'].split()[1].lower()}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{args.model}, {args.engine}, {args.gpus} x {result['gpu']}, rows of {args.length} tokens ({path.name})")
    print(f"| tokens/s 1 GPU | tokens/s {args.gpus} GPUs | speedup | longest row 1 / {args.gpus} | capacity | "
          "attention imbalance | loss rel. diff | grad rel. diff (noise) |")
    longest = {gpus: search["longest"] for gpus, search in result.get("longest_row", {}).items()}
    capacity = f"{result['capacity_ratio']:.2f}x" if result["capacity_ratio"] else "-"
    print(f"| {one['tokens_per_s']:,.0f} | {many['tokens_per_s']:,.0f} | {result['speedup']:.2f}x | "
          f"{longest.get('1')} / {longest.get(str(args.gpus))} | {capacity} | "
          f"{result['imbalance']:.1%} | {result['loss_rel_diff']:.1e} | {result['grad_rel_diff']:.1e} "
          f"({result['grad_noise']:.1e}) |")


if __name__ == "__main__":
    main()
