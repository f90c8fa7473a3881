"""Measuring one callable: correctness against the reference, median time, peak memory, build time.

Each function here answers one question about a peer's ``fn(q, k, v) -> out`` and returns plain numbers, so
`benchmarks.run` can put them in a row. Times are medians of `triton.testing.do_bench` (CUDA events, warm-up first),
or with `sustained_ms` the mean of seconds of calls back to back; peak memory is ``torch.cuda.max_memory_allocated``
over one call minus what was allocated before it (the call's outputs, workspace and temporaries; its inputs and
masks are not counted).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

MAX_REL_ERR = 2e-2  # fp16 / bf16 operands against a float32 reference land between 1e-3 and 1e-2
MIB = 1 << 20


class CheckFailed(AssertionError):
    """A peer's output or gradients differ from the reference by more than `MAX_REL_ERR`."""


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float32 (NaN if either holds a NaN)."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def forward_fn(fn: Callable, q, k, v) -> Callable[[], torch.Tensor]:
    """The forward alone, on inputs that need no grad (what inference runs)."""
    q, k, v = (t.detach() for t in (q, k, v))

    def run():
        with torch.no_grad():
            return fn(q, k, v)

    return run


def forward_backward_fn(fn: Callable, q, k, v, dout) -> Callable[[], tuple[torch.Tensor, ...]]:
    """Forward then backward of ``dout``; returns (out, dq, dk, dv) and leaves no grad behind (so each
    call starts from the same memory)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def run():
        out = fn(*leaves)
        out.backward(dout)
        grads = [t.grad for t in leaves]
        for t in leaves:
            t.grad = None
        return (out.detach(), *grads)

    return run


def check(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], names: tuple[str, ...]) -> dict[str, float]:
    """Relative errors of ``got`` against ``want`` by name; raise `CheckFailed` past `MAX_REL_ERR`."""
    errors = {name: rel_err(g, w) for name, g, w in zip(names, got, want)}
    bad = {name: err for name, err in errors.items() if not err <= MAX_REL_ERR}  # NaN fails too
    if bad:
        raise CheckFailed(", ".join(f"{name} rel err {err:.2e}" for name, err in bad.items())
                          + f" (> {MAX_REL_ERR:.0e})")
    return errors


def median_ms(run: Callable[[], object], rep: float = 100) -> float:
    """Median milliseconds of ``run`` by `triton.testing.do_bench` (25 ms warm-up, ``rep`` ms of repeats)."""
    import triton.testing

    return float(triton.testing.do_bench(run, warmup=25, rep=rep, return_mode="median"))


def sustained_ms(run: Callable[[], object], seconds: float) -> float:
    """Milliseconds per call of ``run`` called back to back for ``seconds`` (after a few warm-up calls), by CUDA
    events around the whole loop; L2 is not flushed. Long enough (a few seconds), this is the regime of a training
    step: the GPU at its power cap, its clock set by the kernel's power draw, which `median_ms`'s short bursts
    after idle gaps do not reach (an H100 at its 700 W cap ran omni 3-9% below FlashAttention-4's clock)."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start, calls = time.perf_counter(), 0
    begin.record()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            run()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / calls


def peak_mib(run: Callable[[], object]) -> float:
    """MiB allocated at the peak of one call of ``run`` beyond what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return (peak - before) / MIB


def build_ms(build: Callable[[], object], repeats: int = 10, cuda: bool = True) -> tuple[float, float]:
    """(first call, median of ``repeats`` later calls) in milliseconds, synchronising a GPU build."""
    def once() -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        build()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    first = once()
    return first, statistics.median(once() for _ in range(repeats))


def skip_reason(err: BaseException) -> str | None:
    """Why a peer cannot run an input (out of memory, no SDPA kernel for it), or None for a real failure."""
    text = str(err)
    if isinstance(err, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return f"out of memory ({describe_error(err)})"
    if "No available kernel" in text or "No viable backend" in text:
        return f"backend cannot run this input ({describe_error(err)})"
    return None


def describe_error(err: BaseException) -> str:
    """One short line for a report: the exception type and the first line of its message."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {(lines[0] if lines else '')[:160]}"


def capture_graph(step: Callable):
    """``step()`` warmed up on a side stream (as CUDA-graph capture requires), then captured into a CUDA graph;
    returns the graph and the outputs of the captured call (the buffers each replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    return graph, outputs

