"""Forward and forward+backward attention speed: omni_hf's CUDA kernels against their peers, in one run.

    python benchmarks/bench_attention.py [--seqlens 8192,16384,32768] [--masks vlm,causal] [--no-backward]

bf16, B=1, Hq=32, Hkv=8, D=128. Masks: a packed VLM row (documents of 2k-6k tokens, inside each text runs
of 16-256 tokens alternating with 576-token images) built with `OmniBlockMask.from_token_ids`, and plain
causal. Peers: `torch.compile(flex_attention)` with a `create_block_mask` of the same rule (mask_mod reading
the id tensors), and on causal SDPA's FlashAttention-2 and cuDNN backends. Every peer's output is checked
against ours before it is timed. Times are medians of `triton.testing.do_bench`; TFLOP/s count only the
allowed (q, k) pairs (4 * D flops per pair forward, 2.5x that backward). Writes JSON to $OUT if set, else
to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from omni_hf import OmniBlockMask, _cuda

BATCH, HEADS_Q, HEADS_KV, DIM = 1, 32, 8, 128
DTYPE = torch.bfloat16
IMAGE_TOKENS = 576
MAX_REL_DIFF = 2e-2  # two bf16 implementations of the same function


def vlm_ids(seq_len: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """doc / group ids int32 [seq_len] of one packed row: documents of 2k-6k tokens, each alternating text
    runs of 16-256 tokens with 576-token images (one group id per image)."""
    rng = np.random.default_rng(seed)
    doc = np.empty(seq_len, np.int32)
    grp = np.full(seq_len, -1, np.int32)
    pos, d, g = 0, 0, 0
    while pos < seq_len:
        end = min(pos + int(rng.integers(2048, 6145)), seq_len)
        doc[pos:end] = d
        p = pos
        while p < end:
            p += int(rng.integers(16, 257))  # text run
            img_end = min(p + IMAGE_TOKENS, end)
            if p < img_end:
                grp[p:img_end] = g
                g += 1
            p = img_end
        pos, d = end, d + 1
    return doc, grp


def _run_lengths(ids: np.ndarray) -> np.ndarray:
    """Lengths of the runs of equal, non-negative ids (documents and images are contiguous runs)."""
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    lengths = np.diff(np.r_[starts, len(ids)])
    return lengths[ids[starts] >= 0]


def allowed_pairs_token_rule(doc: np.ndarray, grp: np.ndarray) -> int:
    """Allowed (q, k) pairs of the token rule with q_len == kv_len: causal inside each document plus the
    upper triangle of each image, counted per run without building S x S."""
    docs = _run_lengths(doc).astype(np.int64)
    images = _run_lengths(grp).astype(np.int64)
    return int((docs * (docs + 1) // 2).sum() + (images * (images - 1) // 2).sum())


def _bench(fn) -> float:
    """Median milliseconds of fn (after warm-up)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _fwd_bwd(fn, q, k, v, dout):
    def run():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(dout)
    return run


class Case:
    """One mask at one length: inputs, our mask and the peers' callables."""

    def __init__(self, mask_name: str, seq_len: int):
        g = torch.Generator(device="cuda").manual_seed(seq_len)
        shape_q, shape_kv = (BATCH, HEADS_Q, seq_len, DIM), (BATCH, HEADS_KV, seq_len, DIM)
        self.q = torch.randn(shape_q, generator=g, device="cuda", dtype=DTYPE).requires_grad_()
        self.k = torch.randn(shape_kv, generator=g, device="cuda", dtype=DTYPE).requires_grad_()
        self.v = torch.randn(shape_kv, generator=g, device="cuda", dtype=DTYPE).requires_grad_()
        self.dout = torch.randn(shape_q, generator=g, device="cuda", dtype=DTYPE)
        self.name, self.seq_len, self.scale = mask_name, seq_len, DIM ** -0.5
        if mask_name == "vlm":
            doc, grp = vlm_ids(seq_len)
            self.pairs = allowed_pairs_token_rule(doc, grp)
            self.doc, self.grp = torch.from_numpy(doc).cuda(), torch.from_numpy(grp).cuda()
            self.mask = OmniBlockMask.from_token_ids(self.doc, self.grp)
        else:
            self.pairs = seq_len * (seq_len + 1) // 2
            self.mask = OmniBlockMask.causal(seq_len, device="cuda")

    def flops(self, backward: bool) -> float:
        return 4.0 * DIM * HEADS_Q * BATCH * self.pairs * (3.5 if backward else 1.0)

    def omni(self, q, k, v):
        from omni_hf import omni_attention

        return omni_attention(q, k, v, self.mask, scale=self.scale)

    def flex_mask_mod(self):
        if self.name == "causal":
            return lambda b, h, q_idx, kv_idx: q_idx >= kv_idx
        doc, grp = self.doc, self.grp

        def mask_mod(b, h, q_idx, kv_idx):
            same_doc = (doc[q_idx] >= 0) & (doc[q_idx] == doc[kv_idx])
            return same_doc & ((kv_idx <= q_idx) | ((grp[q_idx] >= 0) & (grp[q_idx] == grp[kv_idx])))

        return mask_mod

    def peers(self) -> dict:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        torch._dynamo.reset()  # a fresh compile per case: past the recompile limit flex falls back to eager
        block_mask = create_block_mask(self.flex_mask_mod(), None, None, self.seq_len, self.seq_len, device="cuda")
        flex = torch.compile(flex_attention, dynamic=False)
        peers = {"flex_attention (compiled)": lambda q, k, v: flex(q, k, v, block_mask=block_mask, scale=self.scale,
                                                                   enable_gqa=True)}
        if self.name == "causal":
            for label, backend in (("sdpa flash-attention-2", SDPBackend.FLASH_ATTENTION),
                                   ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
                def sdpa(q, k, v, backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                                              enable_gqa=True)
                peers[label] = sdpa
        return peers


def _time(case: Case, label: str, fn, reference: torch.Tensor | None, backward: bool) -> dict:
    row = {"mask": case.name, "seq_len": case.seq_len, "impl": label}
    try:
        with torch.no_grad():
            out = fn(case.q, case.k, case.v)
        if reference is not None:
            row["rel_diff_vs_omni"] = _rel_diff(out, reference)
            if not row["rel_diff_vs_omni"] <= MAX_REL_DIFF:
                raise AssertionError(f"output differs from omni by {row['rel_diff_vs_omni']:.2e}")
        row["fwd_ms"] = _bench(lambda: fn(case.q.detach(), case.k.detach(), case.v.detach()))
        row["fwd_tflops"] = case.flops(False) / row["fwd_ms"] * 1e-9
        if backward:
            row["fwd_bwd_ms"] = _bench(_fwd_bwd(fn, case.q, case.k, case.v, case.dout))
            row["fwd_bwd_tflops"] = case.flops(True) / row["fwd_bwd_ms"] * 1e-9
    except Exception as err:  # noqa: BLE001 - a failing peer is reported, the others still run
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return row


def _omni_backward_works(case: Case) -> bool:
    try:
        case.omni(case.q, case.k, case.v).backward(case.dout)
        torch.cuda.synchronize()
        return True
    except RuntimeError as err:
        print(f"omni backward unavailable: {str(err).splitlines()[0]}")
        return False
    finally:
        for t in (case.q, case.k, case.v):
            t.grad = None


def run(seqlens: list[int], masks: list[str], backward: bool) -> list[dict]:
    os.environ.setdefault("OMNI_HF_BACKEND", "cuda")
    rows = []
    for mask_name in masks:
        for seq_len in seqlens:
            case = Case(mask_name, seq_len)
            with torch.no_grad():
                ours = case.omni(case.q, case.k, case.v)
            omni_bwd = backward and _omni_backward_works(case)
            rows.append(_time(case, "omni", case.omni, None, omni_bwd))
            print(_format_row(rows[-1]), flush=True)
            for label, fn in case.peers().items():
                rows.append(_time(case, label, fn, ours, omni_bwd))
                print(_format_row(rows[-1]), flush=True)
            del case
            torch.cuda.empty_cache()
    return rows


def _format_row(row: dict) -> str:
    cells = [f"{row['mask']:<7}", f"{row['seq_len']:>6}", f"{row['impl']:<26}"]
    for key in ("fwd_ms", "fwd_tflops", "fwd_bwd_ms", "fwd_bwd_tflops"):
        value = row.get(key)
        cells.append(f"{value:>9.2f}" if value is not None else f"{'-':>9}")
    diff = row.get("rel_diff_vs_omni")
    cells.append(f"{diff:>9.1e}" if diff is not None else f"{'':>9}")
    if "error" in row:
        cells.append(row["error"])
    return " ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", default="8192,16384,32768")
    parser.add_argument("--masks", default="vlm,causal")
    parser.add_argument("--no-backward", action="store_true")
    args = parser.parse_args()
    if not _cuda.available():
        raise SystemExit(f"omni_hf CUDA library unavailable: {_cuda._load_error()}")
    start = time.time()
    rows = run([int(s) for s in args.seqlens.split(",")], args.masks.split(","), not args.no_backward)
    device = torch.cuda.get_device_name()
    result = {"device": device, "torch": torch.__version__, "dtype": str(DTYPE), "batch": BATCH,
              "heads_q": HEADS_Q, "heads_kv": HEADS_KV, "head_dim": DIM, "host": platform.node(),
              "seconds": round(time.time() - start, 1), "rows": rows}
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).resolve().parent / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench_attention_{device.replace(' ', '_')}.json"
    path.write_text(json.dumps(result, indent=1))
    header = f"{'mask':<7} {'S':>6} {'impl':<26} {'fwd ms':>9} {'fwd TF/s':>9} {'f+b ms':>9} {'f+b TF/s':>9} {'diff':>9}"
    print(f"\n{device}, bf16, B={BATCH} Hq={HEADS_Q} Hkv={HEADS_KV} D={DIM}; TFLOP/s over allowed pairs")
    print(header)
    for row in rows:
        print(_format_row(row))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
