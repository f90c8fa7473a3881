"""omni, Flex's FLASH backend (FlashAttention-4) and, on causal masks, SDPA's cuDNN backend run one suite layout in
turns, each looped for 3 s after 1 s idle, two rounds, while nvidia-smi samples the SM clock, power and throttle
reasons every 50 ms. Prints each phase's time per call and its clock and power (first 0.5 s dropped):

    python benchmarks/results/profiles/sustained_clocks.py causal 8192 fwd

Unlike the suite (`triton.testing.do_bench`: 100 ms of calls, L2 flushed before each), this is the regime of a
training step: back to back at the power cap. B 1, 32 query / 8 KV heads of 128, bf16. Needs a GPU and
`flash_attn.cute` (`benchmarks/flash_setup.sh`).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import tempfile
import time

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from benchmarks import layouts, measure
from omni_hf import omni_attention

SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def calls(mask: str, seq_len: int, mode: str) -> dict:
    """name -> a call of that implementation: the forward, or with mode "fwd_bwd" the forward and its backward."""
    layout = layouts.build(mask, seq_len)
    gen = torch.Generator(device="cuda").manual_seed(0)
    grad = mode == "fwd_bwd"
    q = torch.randn((1, 32, seq_len, 128), generator=gen, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    k, v = (torch.randn((1, 8, seq_len, 128), generator=gen, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
            for _ in range(2))
    dout = torch.randn_like(q)
    omni_mask = layout.omni_mask(128, "cuda")
    block_mask = create_block_mask(layout.mask_mod("cuda"), None, None, seq_len, seq_len, device="cuda")
    flash = torch.compile(flex_attention, dynamic=False)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    forward = {"omni": lambda: omni_attention(q, k, v, omni_mask),
               "flash": lambda: flash(q, k, v, block_mask=block_mask, enable_gqa=True,
                                      kernel_options={"BACKEND": "FLASH"})}
    if mask == "causal":
        forward["cudnn"] = cudnn
    if not grad:
        return forward
    return {name: (lambda f=f: torch.autograd.backward(f(), dout)) for name, f in forward.items()}


def phase(call, seconds: float = 3.0) -> tuple[float, float, float]:
    """(start, end, ms per call) of `call` looped for `seconds` (`measure.sustained_ms`)."""
    start = time.time()
    ms = measure.sustained_ms(call, seconds)
    return start, time.time(), ms


def samples(path: str) -> list[tuple[float, float, float, str, str]]:
    """nvidia-smi's CSV lines (SMI_FIELDS) as (epoch seconds, SM MHz, watts, temperature, throttle reasons)."""
    rows = []
    with open(path) as lines:
        text = lines.read()
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((t, float(parts[1].split()[0]), float(parts[2].split()[0]), parts[3], parts[4]))
        except (ValueError, IndexError):
            continue
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mask", choices=layouts.MASKS)
    parser.add_argument("seq_len", type=int)
    parser.add_argument("mode", choices=("fwd", "fwd_bwd"))
    args = parser.parse_args()
    runs = calls(args.mask, args.seq_len, args.mode)
    for call in runs.values():  # compiled and warm before the sampling starts
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile("w", suffix=".csv") as log:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader", "-lms", "50"],
                               stdout=log)
        phases = []
        for rnd in range(2):
            for name, call in runs.items():
                time.sleep(1.0)
                phases.append((name, rnd, *phase(call)))
        smi.terminate()
        smi.wait()
        rows = samples(log.name)
    print(f"{args.mask} S {args.seq_len} {args.mode}")
    for name, rnd, start, end, ms in phases:
        sel = [r for r in rows if start + 0.5 <= r[0] <= end]
        clocks, power = sorted(r[1] for r in sel), sorted(r[2] for r in sel)
        print(f"  {name:6s} round {rnd}: {ms:8.3f} ms/call  SM {clocks[len(clocks) // 2]:.0f} MHz (min {clocks[0]:.0f})"
              f"  {power[len(power) // 2]:.0f} W (max {power[-1]:.0f})  {sel[-1][3]} C"
              f"  throttle {sorted(set(r[4] for r in sel))}")


if __name__ == "__main__":
    main()
