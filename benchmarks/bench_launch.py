"""Host cost of a call: what omni spends on the CPU per forward and per forward+backward, and per mask build.

    python -m benchmarks.bench_launch [--calls 2000] [--out DIR]

For each case (a prebuilt mask; inputs on the GPU):
- ``host us``: CPU time per call: bursts of 50 back-to-back calls with no sync, each started on an idle GPU (the
  GPU runs behind and the launch queue never fills, so this is the time a call keeps the CPU: the host overhead);
- ``gpu us``: the kernels' own time, CUDA events around the same calls replayed from a CUDA graph (no launch gaps);
- ``wall us``: one call and a sync, median (what a lone call costs end to end).
Cases: first this host's floor (one ATen op, alone and under autograd; omni's C++ op called directly), then decode
(q 1 x 16 heads, kv 2048 x 4 heads, D 128, bf16, causal), the small training shapes (B 1, H 8, D 64, fp16, S 512 /
1024 / 2048) with an implicit causal mask and a token-rule VLM mask, forward and forward+backward; SDPA beside them
(FlashAttention-2 for decode and S 512, cuDNN for causal S 1024 / 2048: its best there; the backend is chosen once,
outside the timed calls). Then the mask builders per call: `OmniBlockMask.causal`, `OmniBlockMask.full` and
`from_token_ids` on the GPU. A table is printed last; JSON goes to ``--out`` (default $OUT, else
benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks import layouts, measure
from omni_hf import OmniBlockMask, omni_attention
from omni_hf.ops import library


def host_us(fn, calls: int, burst: int = 50) -> float:
    """CPU microseconds per call of ``fn``: the median over bursts of ``burst`` calls issued without a sync, each
    burst started on an idle GPU, so the launch queue never fills and the CPU never waits for the GPU."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(max(1, calls // burst)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(burst):
            fn()
        times.append((time.perf_counter() - start) / burst * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def wall_us(fn, calls: int) -> float:
    """Median microseconds of one call followed by a sync."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def gpu_us(fn, calls: int) -> float:
    """Microseconds of device time per call: ``calls`` calls captured in one CUDA graph, replayed, events."""
    graph, _ = measure.capture_graph(lambda: [fn() for _ in range(calls)])
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def attention_case(name: str, batch: int, heads_q: int, heads_kv: int, q_len: int, kv_len: int, dim: int,
                   dtype: torch.dtype, mask: OmniBlockMask, calls: int) -> list[dict]:
    """Forward (inference) and forward+backward rows of one shape and mask."""
    gen = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(batch, heads_q, q_len, dim, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(batch, heads_kv, kv_len, dim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def forward():
        with torch.no_grad():
            omni_attention(q, k, v, mask)

    def forward_backward():
        torch.autograd.grad(omni_attention(*leaves, mask), leaves, dout)

    rows = []
    for mode, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
        row = {"case": name, "mode": mode, "host_us": host_us(fn, calls), "wall_us": wall_us(fn, min(calls, 300))}
        row["gpu_us"] = gpu_us(fn, 50 if mode == "fwd" else 20)
        rows.append(row)
    return rows


def sdpa_case(name: str, batch: int, heads_q: int, heads_kv: int, q_len: int, kv_len: int, dim: int,
              dtype: torch.dtype, calls: int, backend: str = "FLASH_ATTENTION") -> list[dict]:
    """The same rows for SDPA with ``is_causal`` on one of its backends (``SDPBackend`` name): a plain peer's host
    cost, and its kernels' time beside omni's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(batch, heads_q, q_len, dim, device="cuda", dtype=dtype, generator=gen)
    k, v = (torch.randn(batch, heads_kv, kv_len, dim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    dout = torch.randn_like(q)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    causal = q_len == kv_len  # decode: one query sees every key

    def attend(*qkv):
        return torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=causal, enable_gqa=heads_q != heads_kv)

    def forward():
        with torch.no_grad():
            attend(q, k, v)

    def forward_backward():
        torch.autograd.grad(attend(*leaves), leaves, dout)

    label = {"FLASH_ATTENTION": "fa2", "CUDNN_ATTENTION": "cudnn"}.get(backend, backend.lower())
    with sdpa_kernel(getattr(SDPBackend, backend)):  # entered once: its own cost is not the op's
        return [{"case": f"sdpa-{label} {name}", "mode": mode, "host_us": host_us(fn, calls),
                 "wall_us": wall_us(fn, min(calls, 300)), "gpu_us": captured_gpu_us(fn, 50 if mode == "fwd" else 20)}
                for mode, fn in (("fwd", forward), ("fwd+bwd", forward_backward))]


def floor_cases(calls: int) -> list[dict]:
    """This host's floor under the rows above: one ATen elementwise op (one dispatch, one kernel launch), the same
    under autograd (forward and its backward through the engine), and omni's C++ op called directly on the
    implicit causal mask of S 1024 (the dispatch and launch `omni_attention` adds its Python checks to)."""
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.float16, generator=gen) for _ in range(3))
    leaf = q.clone().requires_grad_()
    grad = torch.randn_like(q)
    tensors, sizes = OmniBlockMask.causal(1024).as_tuple()
    cases = {
        ("torch.mul (one ATen op, S1024 H8 D64)", "fwd"): lambda: torch.mul(q, 2.0),
        ("torch.mul (one ATen op, S1024 H8 D64)", "fwd+bwd"): lambda: torch.autograd.grad(leaf * 2.0, leaf, grad),
        ("omni_hf::fwd op direct, S1024 H8 D64 causal", "fwd"): lambda: library.forward(q, k, v, tensors, sizes,
                                                                                             0.125, 0.0),
    }
    return [{"case": name, "mode": mode, "host_us": host_us(fn, calls), "wall_us": wall_us(fn, min(calls, 300)),
             "gpu_us": gpu_us(fn, 50)} for (name, mode), fn in cases.items()]


def captured_gpu_us(fn, calls: int) -> float:
    """`gpu_us`, or NaN where the peer's kernels refuse CUDA-graph capture."""
    try:
        return gpu_us(fn, calls)
    except RuntimeError as err:
        print(f"no graph timing: {str(err).splitlines()[0]}", file=sys.stderr)
        return float("nan")


def build_case(name: str, fn, calls: int) -> dict:
    return {"case": name, "mode": "mask build", "host_us": host_us(fn, calls), "wall_us": wall_us(fn, min(calls, 300)),
            "gpu_us": float("nan")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results")
    args = parser.parse_args(argv)
    calls = args.calls
    if not library.available():  # also loads the library, which registers omni_hf::fwd
        sys.exit("bench_launch: needs a CUDA device and the omni_hf CUDA library")
    rows = floor_cases(calls)
    rows += attention_case("decode q1 kv2048 H16/4 D128 causal", 1, 16, 4, 1, 2048, 128, torch.bfloat16,
                          OmniBlockMask.causal(1, 2048), calls)
    rows += sdpa_case("decode q1 kv2048 H16/4 D128", 1, 16, 4, 1, 2048, 128, torch.bfloat16, calls)
    rows += sdpa_case("small S512 H8 D64 causal", 1, 8, 8, 512, 512, 64, torch.float16, calls)
    for seq_len in (512, 1024, 2048):
        rows += attention_case(f"small S{seq_len} H8 D64 causal", 1, 8, 8, seq_len, seq_len, 64, torch.float16,
                               OmniBlockMask.causal(seq_len), calls)
        if seq_len > 512:
            rows += sdpa_case(f"small S{seq_len} H8 D64 causal", 1, 8, 8, seq_len, seq_len, 64, torch.float16, calls,
                              backend="CUDNN_ATTENTION")
        vlm = layouts.build("vlm", seq_len).omni_mask(128, "cuda")
        rows += attention_case(f"small S{seq_len} H8 D64 vlm", 1, 8, 8, seq_len, seq_len, 64, torch.float16, vlm,
                               calls)
    doc, grp = layouts.build("vlm", 2048).token_ids("cuda")
    rows += [build_case("OmniBlockMask.causal(1, 2048)", lambda: OmniBlockMask.causal(1, 2048), calls),
             build_case("OmniBlockMask.full(1024)", lambda: OmniBlockMask.full(1024), calls),
             build_case("from_token_ids vlm 2048 (cuda)", lambda: OmniBlockMask.from_token_ids(doc, grp), calls)]
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": calls,
            "command": "python -m benchmarks.bench_launch " + " ".join(argv or sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"{meta['device']}, torch {meta['torch']}")
    print("| case | mode | host us | gpu us | wall us |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['case']} | {row['mode']} | {row['host_us']:.1f} | {row['gpu_us']:.1f} | {row['wall_us']:.1f} |")


if __name__ == "__main__":
    main()
