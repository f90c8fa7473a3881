"""A/B of builds of the CUDA library, omni alone: the kernel time of each case's forward or backward per library.

    python -m benchmarks.kernel_ab base=/path/a.so new=/path/b.so [more=/path/c.so ...] [--tree base=/old/tree] \
        [--pass fwd|bwd] [--cases realistic|masks|small|d64|pairs|d256|d96|towers|decode] [--rounds 3] [--json FILE]

Each library runs in a process of its own (two cannot register the same torch ops in one), named to it by
``OMNI_HF_CUDA_LIB``; within each round the libraries take turns, so drift of the host or the GPU falls on all of
them alike, and every figure is the median of its rounds. Per case and library:

- ``kernel us``: a CUDA graph of `GRAPH_CALLS` calls replayed (do_bench median / `GRAPH_CALLS`): the forward op, or
  the backward alone (preprocess, main kernel, dQ conversion) of a forward run before the capture;
- ``TFLOP/s`` over the allowed pairs (4 * D flops per pair forward, 2.5x that backward);
- ``eager us``: one call from Python, host included (do_bench median);
- ``speed``: the first library's kernel time over this one's (> 1: faster than the first);
- ``sum diff``: the largest relative difference of the outputs' (backward: dq, dk, dv) sums of |x| from the first
  library's. It flags a broken build; it is not an equality check (dQ is summed by reductions in any order, so it
  moves by ~1e-5 between calls and up to ~1e-2 between processes).

The libraries share this tree's Python side, so they must have its ABI, unless ``--tree NAME=DIR`` names the source
tree a library was built from (``git worktree add DIR REV``): its children then run from DIR, with DIR's Python side,
so a library of an older ABI can be timed against this one (DIR's kernel_ab must answer as this one does). A markdown
table is printed last; ``--json`` also keeps every round's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
GRAPH_CALLS = 10
MEDIAN_KEYS = ("kernel_us", "tflops", "eager_us")


class Case(NamedTuple):
    """One input: the suite's mask layout (`benchmarks.layouts.MASKS`, "full": every pair, or "decode": one query,
    the last token, against the ``seq_len`` keys of a cache) at ``seq_len``, q ``[batch, heads_q, seq_len, head_dim]``
    (``decode``: one row) and k / v ``[batch, heads_kv, seq_len, head_dim]`` of ``dtype`` (a torch dtype name)."""

    mask: str
    seq_len: int
    batch: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.mask} S{self.seq_len} B{self.batch} H{self.heads_q}/{self.heads_kv} D{self.head_dim}"


def _realistic(masks: tuple[str, ...], lengths: tuple[int, ...]) -> list[Case]:
    return [Case(mask, length, 1, 32, 8, 128, "bfloat16") for mask in masks for length in lengths]


CASE_SETS: dict[str, list[Case]] = {
    # The suite's realistic shape on the VLM and causal masks.
    "realistic": _realistic(("vlm", "causal"), (8192, 16384, 32768)),
    # The same, the suite's other token-rule masks, head dim 64, and grids of a few waves.
    "masks": _realistic(("vlm", "causal"), (8192, 16384, 32768))
    + _realistic(("documents", "prefix_lm", "sliding_window"), (16384,))
    + [Case("vlm", 16384, 1, 16, 8, 64, "bfloat16"), Case("causal", 4096, 2, 16, 8, 128, "bfloat16"),
       Case("vlm", 4096, 1, 32, 8, 128, "bfloat16"), Case("causal", 2048, 4, 32, 8, 128, "float16")],
    # The small training shape, head dim 128 on both sides of the 64-row-CTA threshold, and two realistic grids.
    "small": [Case(mask, length, 1, 8, 8, 64, "float16") for mask in ("causal", "vlm")
              for length in (512, 1024, 2048, 4096)]
    + [Case("causal", 1024, 1, 8, 8, 128, "bfloat16"), Case("causal", 2048, 1, 4, 4, 128, "bfloat16"),
       Case("causal", 2048, 1, 8, 8, 128, "bfloat16"), Case("vlm", 2048, 1, 8, 8, 128, "bfloat16"),
       Case("causal", 8192, 1, 32, 8, 128, "bfloat16"), Case("vlm", 8192, 1, 32, 8, 128, "bfloat16")],
    # Head dim 64 at grids of 2 to 32 waves of 64-row CTAs.
    "d64": [Case(mask, length, 1, heads, 8, 64, "bfloat16") for mask in ("causal", "vlm")
            for length, heads in ((4096, 16), (8192, 8), (4096, 32), (8192, 32), (16384, 32))],
    # Head dim 64 grids of 133 to 264 64-row CTAs, two per SM (where the launch order pairs long and short tiles).
    "pairs": [Case("causal", 2048, 1, 8, 8, 64, "float16"), Case("vlm", 2048, 1, 8, 8, 64, "float16"),
              Case("causal", 1536, 1, 8, 8, 64, "float16"), Case("causal", 3072, 1, 4, 4, 64, "float16"),
              Case("causal", 2048, 2, 4, 4, 64, "float16"), Case("causal", 1024, 2, 8, 8, 64, "float16"),
              Case("causal", 2048, 1, 16, 8, 64, "float16"), Case("vlm", 1024, 2, 8, 8, 64, "float16")],
    # Head dim 256 (Gemma 2 / 3: 8 query / 4 KV heads) on the VLM and causal masks, and a wide grid.
    "d256": [Case(mask, length, 1, 8, 4, 256, "bfloat16") for mask in ("vlm", "causal") for length in (8192, 16384)]
    + [Case("vlm", 4096, 4, 8, 4, 256, "float16")],
    # Head dim 96 (Phi-3 vision's 32 / 32 heads), the kernels that SigLIP's 72 and Qwen's 80 run on too.
    "d96": [Case(mask, length, 1, 32, 32, 96, "bfloat16") for mask in ("vlm", "causal") for length in (8192, 16384)],
    # Vision towers' calls: every image bidirectional and alone (the implicit full mask), one per batch row, at their
    # towers' head dims (SigLIP's 72 and Qwen's 80, which run on the 96 kernels; CLIP-L's 64): Gemma 3's 896 px
    # images (4096 patches), SigLIP at 384 px (729) and CLIP-L at 336 px (577), and one long bidirectional row.
    "towers": [Case("full", 4096, 16, 16, 16, 72, "bfloat16"), Case("full", 729, 64, 16, 16, 72, "bfloat16"),
               Case("full", 577, 64, 16, 16, 64, "bfloat16"), Case("full", 2304, 4, 16, 16, 80, "bfloat16"),
               Case("full", 16384, 1, 32, 8, 128, "bfloat16")],
    # One decoding step (the split-KV kernel): a ~1B Llama's 32 / 8 heads of 64 after a 1024-token prompt, and
    # longer caches; 32 / 8 heads of 128 (Llama 3 8B, Qwen2.5-VL's language model).
    "decode": [Case("decode", length, batch, 32, 8, dim, "bfloat16")
               for dim in (64, 128) for batch in (1, 8) for length in (1088, 4096, 16384)],
}


def parse_libraries(specs: list[str]) -> dict[str, str]:
    """``["base=/a.so", "new=/b.so"]`` -> ``{"base": "/a.so", "new": "/b.so"}``, in the order given (the first is
    the one the others are compared with); ValueError for a spec without a name or a path, or a repeated name."""
    libraries: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not (sep and name and path):
            raise ValueError(f"library: expected NAME=PATH, got {spec!r}")
        if name in libraries:
            raise ValueError(f"library: the name {name!r} is given twice")
        libraries[name] = path
    return libraries


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_ab", description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="*", metavar="NAME=PATH", help="the library builds, the first the baseline")
    parser.add_argument("--pass", dest="which", default="fwd", choices=("fwd", "bwd"), help="what is timed")
    parser.add_argument("--cases", default="realistic", choices=tuple(CASE_SETS))
    parser.add_argument("--rounds", type=int, default=3, help="each library runs once per round (default 3)")
    parser.add_argument("--json", type=Path, default=None, help="also write every round's rows here")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="run library NAME's children from the source tree DIR (its own Python side and ABI)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds: expected an integer >= 1, got {args.rounds}")
    if not args.child:
        try:
            args.libraries = parse_libraries(args.libraries)
        except ValueError as err:
            parser.error(str(err))
        if not args.libraries:
            parser.error("expected at least one NAME=PATH")
        try:
            args.trees = parse_trees(args.tree, args.libraries)
        except ValueError as err:
            parser.error(str(err))
    return args


def parse_trees(specs: list[str], libraries: dict[str, str]) -> dict[str, str]:
    """``--tree`` values ``["base=/old"]`` -> ``{library path: tree}``; ValueError for a name that is not a library's
    or a folder without ``benchmarks/kernel_ab.py``."""
    trees: dict[str, str] = {}
    for spec in specs:
        name, sep, tree = spec.partition("=")
        if not (sep and name in libraries):
            raise ValueError(f"--tree: expected NAME=DIR with NAME one of {', '.join(libraries)}, got {spec!r}")
        if not (Path(tree) / "benchmarks" / "kernel_ab.py").is_file():
            raise ValueError(f"--tree: expected a source tree holding benchmarks/kernel_ab.py, got {tree!r}")
        trees[libraries[name]] = str(Path(tree).resolve())
    return trees


def measure_case(case: Case, which: str) -> dict:
    """Kernel and eager microseconds, TFLOP/s and the outputs' sums of |x| of one case with the library this process
    loaded. Everything runs on one side stream, the graph's capture stream: a backward runs on its forward's stream,
    so the forward must have run there for the captured backward to be the graph's."""
    import torch

    from benchmarks import layouts, measure
    from omni_hf import OmniBlockMask, omni_attention

    q_len = 1 if case.mask == "decode" else case.seq_len
    if case.mask == "full":
        mask, allowed_pairs = OmniBlockMask.full(case.seq_len), case.seq_len ** 2
    elif case.mask == "decode":
        mask, allowed_pairs = OmniBlockMask.causal(1, case.seq_len), case.seq_len
    else:
        layout = layouts.build(case.mask, case.seq_len)
        mask, allowed_pairs = layout.omni_mask(128, "cuda"), layout.allowed_pairs()
    gen = torch.Generator("cuda").manual_seed(case.seq_len)
    dtype = getattr(torch, case.dtype)
    q, k, v = (torch.randn(case.batch, heads, rows, case.head_dim, device="cuda", dtype=dtype, generator=gen)
               for heads, rows in ((case.heads_q, q_len), (case.heads_kv, case.seq_len), (case.heads_kv, case.seq_len)))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if which == "fwd":
            def step():
                with torch.no_grad():
                    return (omni_attention(q, k, v, mask),)
        else:
            leaves = [t.requires_grad_() for t in (q, k, v)]
            out = omni_attention(*leaves, mask)
            dout = torch.randn(out.shape, device="cuda", dtype=dtype, generator=gen)

            def step():
                return torch.autograd.grad(out, leaves, dout, retain_graph=True)

        eager_us = measure.median_ms(step) * 1e3  # also the warm-up the capture needs
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            outputs = [step() for _ in range(GRAPH_CALLS)][-1]
        kernel_us = measure.median_ms(graph.replay) * 1e3 / GRAPH_CALLS
        sums = [float(t.double().abs().sum()) for t in outputs]
    flop = (2.5 if which == "bwd" else 1.0) * 4 * case.batch * case.heads_q * case.head_dim * allowed_pairs
    return {"case": case.label, "kernel_us": kernel_us, "tflops": flop / kernel_us / 1e6, "eager_us": eager_us,
            "sums": sums}


def measure_cases(cases: list[Case], which: str) -> dict:
    """The child's answer: the GPU, torch and library, and `measure_case` of every case."""
    import torch

    from omni_hf.kernels import loader

    if not loader.available():
        raise SystemExit("kernel_ab: needs a CUDA device and the omni_hf CUDA library")
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "library": str(loader.library_path()),
            "rows": [measure_case(case, which) for case in cases]}


def child_process(child_args: list[str], trees: dict[str, str] | None = None) -> Callable[[str], dict]:
    """A runner for `alternate`: ``python -m benchmarks.kernel_ab --child *child_args`` from the repository root, or
    from the library's own source tree where ``trees`` (by library path) names one, with ``OMNI_HF_CUDA_LIB``
    naming the library; returns the child's answer (its last line of output)."""
    def run(library: str) -> dict:
        root = (trees or {}).get(library, str(REPO_ROOT))
        env = {**os.environ, "OMNI_HF_CUDA_LIB": str(Path(library).resolve()), "PYTHONPATH": root}
        done = subprocess.run([sys.executable, "-m", "benchmarks.kernel_ab", "--child", *child_args], env=env,
                              cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"kernel_ab: the child for {library} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    return run


def alternate(libraries: dict[str, str], rounds: int, run: Callable[[str], dict]) -> dict[str, list[dict]]:
    """``run(path)`` once per library and round, the libraries taking turns within each round; every answer by
    library name, in round order. A progress line per answer goes to stderr."""
    runs: dict[str, list[dict]] = {name: [] for name in libraries}
    for round_index in range(rounds):
        for name, path in libraries.items():
            answer = run(path)
            runs[name].append(answer)
            print(f"[{round_index + 1}/{rounds}] {name}: "
                  + ", ".join(f"{row['kernel_us']:.1f}" for row in answer["rows"]),
                  file=sys.stderr, flush=True)
    return runs


def _relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    """Per case: ``{"case", "libraries": {name: {kernel_us, tflops, eager_us (medians over the rounds), speed,
    sum_diff}}}``; ``speed`` is the first library's median kernel time over this library's, ``sum_diff`` the
    largest relative difference of any round's sums from the first library's first round."""
    names = list(runs)
    reference = runs[names[0]][0]["rows"]
    summary = []
    for i, ref_row in enumerate(reference):
        per_library = {}
        for name in names:
            rows = [answer["rows"][i] for answer in runs[name]]
            medians = {key: statistics.median(row[key] for row in rows) for key in MEDIAN_KEYS}
            medians["sum_diff"] = max(_relative(a, b) for row in rows for a, b in zip(row["sums"], ref_row["sums"]))
            per_library[name] = medians
        for medians in per_library.values():
            medians["speed"] = per_library[names[0]]["kernel_us"] / medians["kernel_us"]
        summary.append({"case": ref_row["case"], "libraries": per_library})
    return summary


def table(summary: list[dict]) -> str:
    """A markdown table of `summarise`'s rows: the first library's kernel us, TFLOP/s and eager us, then for each
    other library the same with its speed and sum diff against the first."""
    names = list(summary[0]["libraries"])
    header = ["case"]
    for index, name in enumerate(names):
        header += [f"{name} kernel us", f"{name} TFLOP/s", f"{name} eager us"]
        if index:
            header += [f"{name} speed", f"{name} sum diff"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in summary:
        cells = [entry["case"]]
        for index, name in enumerate(names):
            got = entry["libraries"][name]
            cells += [f"{got['kernel_us']:.1f}", f"{got['tflops']:.0f}", f"{got['eager_us']:.1f}"]
            if index:
                cells += [f"{got['speed']:.3f}", f"{got['sum_diff']:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cases = CASE_SETS[args.cases]
    child_args = ["--pass", args.which, "--cases", args.cases]
    if args.child:
        print(json.dumps(measure_cases(cases, args.which)))
        return
    runs = alternate(args.libraries, args.rounds, child_process(child_args, args.trees))
    first = runs[next(iter(runs))][0]
    print(f"{first['device']}, torch {first['torch']}; pass {args.which}, cases {args.cases}, "
          f"median of {args.rounds} rounds")
    print(table(summarise(runs)))
    if args.json:
        args.json.write_text(json.dumps({"command": "python -m benchmarks.kernel_ab " + " ".join(argv or sys.argv[1:]),
                                         "libraries": args.libraries, "trees": args.trees, "runs": runs},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
