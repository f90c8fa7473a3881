"""omni alone on the realistic shape, for kernel work: forward, forward+backward and the backward by difference.

    python -m benchmarks.bench_kernels [--masks vlm,causal] [--seqlens 8192,16384] [--head-dim 128] [--heads 32/8]
                                       [--features none,sinks,bias,deterministic] [--window W] [--rounds N]

The suite's realistic shape (B=1, Hq=32, Hkv=8, D=128, bf16, blocks of 128; ``--head-dim`` and ``--heads HQ/HKV``
change it); TFLOP/s over the allowed (q, k) pairs (4 * Hq * D flops per pair forward,
2.5 times that backward), do_bench medians. No peers and no reference check: `python -m benchmarks.run` does
those. Run it with OMNI_HF_CUDA_LIB set to compare two builds of the library. The first line is the physical
yardstick: a plain bf16 GEMM (8192^3, torch.matmul) on the same GPU, and each case gives its forward rate as a
fraction of it. ``--window W`` sets the ``sliding_window`` mask's window (default its own, min(1024, S/4)).

``--features`` times each case's call with these too, each beside the plain call (``none``, always timed) in the same
run, its times printed relative to none's (the feature's cost, e.g. ``sinks fwd 1.012x``):

- ``sinks``: float32 ``[Hq]`` sink logits requiring grad, ``omni_attention(..., sinks=)`` (gpt-oss's ``s_aux``);
- ``bias``: a bf16 ``[1, Hq, S, S]`` additive bias requiring grad, ``omni_attention(..., bias=)`` (T5's
  ``position_bias``); where this omni has no ``bias`` the case prints ``skipped: <error>``. Beside it, SDPA
  forward+backward given the same bias as its float ``attn_mask`` (the bias where the mask allows, the dtype's lowest
  value elsewhere, as Transformers' sdpa hands it; the mask's gradient taken, K/V repeated per query head as
  Transformers does) on the memory-efficient and cuDNN backends, and math where S <= 4096; omni's bias
  forward+backward against the fastest of them (``speedup over sdpa-cudnn 1.80x``: its time over omni's), and the
  relative error of omni's output against that backend's;
- ``deterministic``: ``omni_attention(..., deterministic=True)``, the backward's dQ added in a fixed order.

``--rounds N`` times the case's calls in turn N times, each call's time the median of its rounds (100/N ms of
do_bench repeats each), so that drift of the GPU's clock falls on all of them alike: a cost of a few percent needs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Callable

import torch

from benchmarks import layouts, measure
from benchmarks.peers import _repeat_kv
from benchmarks.run import SHAPES, Shape
from omni_hf import omni_attention
from omni_hf.ops.attention import MAX_HEAD_DIM

SHAPE = SHAPES["realistic"]
FEATURES = ("none", "sinks", "bias", "deterministic")
SDPA_MATH_MAX = 4096  # the math backend (S x S scores in several copies) only up to this length


def gemm_tflops(n: int = 8192) -> float:
    """TFLOP/s of an n x n x n bf16 matmul (do_bench median)."""
    gen = torch.Generator("cuda").manual_seed(0)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    return 2 * n**3 / measure.median_ms(lambda: a @ b) / 1e9


def feature_inputs(feature: str, shape: Shape, seq_len: int) -> dict[str, torch.Tensor | bool]:
    """`omni_attention`'s keyword arguments for ``feature``: tensors are leaves requiring grad (none: nothing)."""
    gen = torch.Generator("cuda").manual_seed(1)
    if feature == "sinks":
        return {"sinks": torch.randn(shape.heads_q, device="cuda", generator=gen).requires_grad_()}
    if feature == "bias":
        return {"bias": torch.randn(1, shape.heads_q, seq_len, seq_len, device="cuda", generator=gen,
                                    dtype=shape.dtype).requires_grad_()}
    if feature == "deterministic":
        return {"deterministic": True}
    return {}


def timed_calls(fn: Callable, q, k, v, dout, extra: dict[str, torch.Tensor | bool]) -> dict[str, Callable]:
    """The forward and the forward+backward of ``fn(q, k, v)``; the backward's gradients of ``extra`` (the feature's
    leaves) are dropped after each call, so that no call accumulates into the last one's (an S x S bias would add
    a pass over its gradient)."""
    both = measure.forward_backward_fn(fn, q, k, v, dout)

    def forward_backward():
        out = both()
        for t in extra.values():
            if isinstance(t, torch.Tensor):
                t.grad = None
        return out

    return {"fwd": measure.forward_fn(fn, q, k, v), "fwd+bwd": forward_backward}


def time_rounds(calls: dict[str, dict[str, Callable]], rounds: int) -> dict[str, dict[str, float] | str]:
    """Milliseconds of every call of every label (the median of its ``rounds``, the labels timed in turn within
    each round), or the label's error as one line where a call raised (its other calls are not timed)."""
    times: dict[str, dict[str, list[float]]] = {label: {} for label in calls}
    failed: dict[str, str] = {}
    for _ in range(rounds):
        for label, runs in calls.items():
            if label in failed:
                continue
            try:
                for kind, run in runs.items():
                    times[label].setdefault(kind, []).append(measure.median_ms(run, rep=100 / rounds))
            except Exception as err:  # noqa: BLE001 -- an unknown keyword, no kernel, out of memory: reported
                failed[label] = measure.describe_error(err)
                torch.cuda.empty_cache()
    return {label: failed.get(label) or {kind: statistics.median(ms) for kind, ms in times[label].items()}
            for label in calls}


def time_case(name: str, seq_len: int, gemm: float, shape: Shape = SHAPE, features: tuple[str, ...] = ("none",),
              window: int | None = None, rounds: int = 1) -> list[str]:
    """The lines of mask `name` at `seq_len`: forward, forward+backward and backward TFLOP/s and milliseconds of the
    plain call, then of each feature with its cost against the plain call; with ``bias``, SDPA given the bias."""
    layout = layouts.build(name, seq_len)
    if window is not None and layout.window is not None:
        layout = dataclasses.replace(layout, window=window)
    mask = layout.omni_mask(shape.blocks[0], "cuda")
    gen = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(shape.batch, heads, seq_len, shape.dim, device="cuda", generator=gen, dtype=shape.dtype)
               for heads in (shape.heads_q, shape.heads_kv, shape.heads_kv))
    dout = torch.randn_like(q)
    scale = shape.dim**-0.5
    inputs = {feature: feature_inputs(feature, shape, seq_len) for feature in ("none", *features)}

    def attention(extra: dict[str, torch.Tensor | bool]) -> Callable:
        return lambda q, k, v: omni_attention(q, k, v, mask, scale=scale, **extra)

    times = time_rounds({feature: timed_calls(attention(extra), q, k, v, dout, extra)
                         for feature, extra in inputs.items()}, rounds)
    flop = 4 * shape.batch * shape.heads_q * shape.dim * layout.allowed_pairs()
    lines = []
    for feature, got in times.items():
        if isinstance(got, str):
            lines.append(f"{name:8s} S={seq_len:6d} {feature}: skipped: {got}")
            continue
        fwd_ms, both_ms = got["fwd"], got["fwd+bwd"]
        rates = (f"TFLOP/s fwd {flop / fwd_ms / 1e9:4.0f}  fwd+bwd {3.5 * flop / both_ms / 1e9:4.0f}  "
                 f"bwd {2.5 * flop / (both_ms - fwd_ms) / 1e9:4.0f}  (fwd {fwd_ms:.3f} ms, fwd+bwd {both_ms:.3f} ms")
        if feature == "none":
            lines.append(f"{name:8s} S={seq_len:6d} {rates}; fwd {flop / fwd_ms / 1e9 / gemm:.0%} of the GEMM)")
        else:
            plain = times["none"]
            cost = (f"{feature} fwd {fwd_ms / plain['fwd']:.3f}x fwd+bwd {both_ms / plain['fwd+bwd']:.3f}x"
                    if isinstance(plain, dict) else "")
            lines.append(f"{name:8s} S={seq_len:6d} {feature:5s} {rates}) {cost}")
    if "bias" in features:  # SDPA's times even where omni has no bias yet: the yardstick for when it has
        omni = None
        if isinstance(times["bias"], dict):
            omni = times["bias"]["fwd+bwd"], measure.forward_fn(attention(inputs["bias"]), q, k, v)()
        lines.append(sdpa_with_bias(name, seq_len, layout, q, k, v, dout, inputs.pop("bias")["bias"].detach(), scale,
                                    omni, rounds))
    return lines


def sdpa_with_bias(name: str, seq_len: int, layout: layouts.Layout, q, k, v, dout, bias: torch.Tensor, scale: float,
                   omni: tuple[float, torch.Tensor] | None, rounds: int) -> str:
    """One line: SDPA forward+backward on each backend given ``bias`` where the layout allows (its float
    ``attn_mask``, requiring grad), and, with ``omni`` (omni's bias forward+backward ms and its output), omni against
    the fastest; ``bias`` is released here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    allowed = layout.dense("cuda")
    attn_mask = torch.where(allowed, bias, torch.finfo(bias.dtype).min).requires_grad_()
    del bias, allowed
    backends = {"eff": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    if seq_len <= SDPA_MATH_MAX:
        backends["math"] = SDPBackend.MATH

    def sdpa(backend) -> Callable:
        def fn(q, k, v):
            k, v = _repeat_kv(k, v, q.shape[1])  # as Transformers' sdpa does (no native GQA with a mask everywhere)
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        return fn

    extra = {"attn_mask": attn_mask}
    times = time_rounds({f"sdpa-{label}": {"fwd+bwd": timed_calls(sdpa(backend), q, k, v, dout, extra)["fwd+bwd"]}
                         for label, backend in backends.items()}, rounds)
    ran = {label: got["fwd+bwd"] for label, got in times.items() if isinstance(got, dict)}
    text = ", ".join(f"{label} {got['fwd+bwd']:.3f} ms" if isinstance(got, dict) else f"{label} skipped: {got}"
                     for label, got in times.items())
    if not ran or omni is None:
        return f"{name:8s} S={seq_len:6d} bias  SDPA fwd+bwd: {text}"
    best = min(ran, key=ran.get)
    omni_ms, omni_out = omni
    with torch.no_grad(), sdpa_kernel(backends[best.removeprefix("sdpa-")]):
        k_rep, v_rep = _repeat_kv(k, v, q.shape[1])
        want = torch.nn.functional.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=attn_mask, scale=scale)
    return (f"{name:8s} S={seq_len:6d} bias  SDPA fwd+bwd: {text}; omni bias fwd+bwd {omni_ms:.3f} ms, speedup over "
            f"{best} {ran[best] / omni_ms:.2f}x (out rel err vs {best} {measure.rel_err(omni_out, want):.1e})")


def parse_heads(text: str) -> tuple[int, int]:
    """``"32/8"`` -> ``(32, 8)``; HKV must divide HQ."""
    try:
        heads_q, heads_kv = (int(h) for h in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HQ/HKV, got {text!r}") from None
    if heads_q < 1 or heads_kv < 1 or heads_q % heads_kv:
        raise argparse.ArgumentTypeError(f"expected HKV dividing HQ, got {text!r}")
    return heads_q, heads_kv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, checked; ``shape`` is the realistic shape at the head dim and heads asked for, ``features`` the
    features asked for with none first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masks", default="vlm,causal", help=f"comma-separated of {layouts.MASKS}")
    parser.add_argument("--seqlens", default="8192,16384", help="comma-separated lengths")
    parser.add_argument("--head-dim", type=int, default=SHAPE.dim, help=f"D (default {SHAPE.dim})")
    parser.add_argument("--heads", type=parse_heads, default=(SHAPE.heads_q, SHAPE.heads_kv),
                        help=f"query / KV heads HQ/HKV (default {SHAPE.heads_q}/{SHAPE.heads_kv})")
    parser.add_argument("--features", default="none", help=f"comma-separated of {FEATURES}; each timed beside none")
    parser.add_argument("--window", type=int, default=None, help="the sliding_window mask's window (default "
                                                                 "min(1024, S/4))")
    parser.add_argument("--rounds", type=int, default=1, help="every call of a case timed once per round in turn")
    args = parser.parse_args(argv)
    args.masks, args.features = args.masks.split(","), args.features.split(",")
    for option, allowed in (("masks", layouts.MASKS), ("features", FEATURES)):
        if bad := sorted(set(getattr(args, option)) - set(allowed)):
            parser.error(f"--{option}: unknown {bad}; expected some of {allowed}")
    try:
        args.seqlens = [int(n) for n in args.seqlens.split(",")]
    except ValueError:
        parser.error(f"--seqlens: expected comma-separated integers, got {args.seqlens!r}")
    if args.head_dim % 8 or not 8 <= args.head_dim <= MAX_HEAD_DIM:
        parser.error(f"--head-dim: expected a multiple of 8 up to {MAX_HEAD_DIM}, got {args.head_dim}")
    if args.rounds < 1 or (args.window is not None and args.window < 1):
        parser.error("--rounds and --window: at least 1")
    args.features = tuple(dict.fromkeys(["none", *args.features]))
    args.shape = dataclasses.replace(SHAPE, dim=args.head_dim, heads_q=args.heads[0], heads_kv=args.heads[1])
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shape = args.shape
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"B={shape.batch} Hq={shape.heads_q} "
          f"Hkv={shape.heads_kv} D={shape.dim}", flush=True)
    gemm = gemm_tflops()
    print(f"bf16 GEMM 8192^3 (torch.matmul): {gemm:.0f} TFLOP/s", flush=True)
    for name in args.masks:
        for seq_len in args.seqlens:
            for line in time_case(name, seq_len, gemm, shape, args.features, args.window, args.rounds):
                print(line, flush=True)


if __name__ == "__main__":
    main()
