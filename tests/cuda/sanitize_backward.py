"""Small backward cases for compute-sanitizer (not a pytest module): the deterministic backward under every way a
CTA finds its Q tiles (block lists of 128- and 64-key blocks, the token rule, causal with a window) at the head dims
given as arguments (default 64 and 128), and a bf16 bias whose rows are padded past the key count (333 keys in rows
of 336: the sm_90a backward stages it, its last 16-byte copy partly zero-filled), per batch row and broadcast over
it, with its gradient. Run on a GPU as

    compute-sanitizer --tool memcheck --kernel-name kns=omni python -m tests.cuda.sanitize_backward
    compute-sanitizer --tool racecheck --kernel-name kns=omni python -m tests.cuda.sanitize_backward

and expect "ERROR SUMMARY: 0 errors"; OMNI_HF_DISABLE_SM90=1 sends every call to the sm_80 kernels.
"""

from __future__ import annotations

import sys

import torch

from omni_hf import OmniBlockMask, omni_attention

BATCH, HEADS_Q, HEADS_KV, LENGTH, PADDED = 2, 4, 2, 333, 336


def masks(gen: torch.Generator) -> dict[str, OmniBlockMask]:
    """Two documents, an image in each (token rule), causal with a window, and random block lists."""
    doc = torch.zeros(BATCH, LENGTH, dtype=torch.int32, device="cuda")
    doc[:, 200:] = 1
    grp = torch.full((BATCH, LENGTH), -1, dtype=torch.int32, device="cuda")
    grp[:, 50:120] = 0
    grp[:, 230:300] = 1

    def random_blocks(block):
        dense = torch.rand(BATCH, 1, LENGTH, LENGTH, device="cuda", generator=gen) < 0.6
        return OmniBlockMask.from_dense(dense, block_size=block)

    return {"token": OmniBlockMask.from_token_ids(doc, grp, block_size=128),
            "causal_window": OmniBlockMask.causal(LENGTH, LENGTH, window=150),
            "blocks128": random_blocks(128), "blocks64": random_blocks(64)}


def run(dim: int, gen: torch.Generator) -> None:
    """Forward and backward of every case at head dim `dim`; raises if a gradient is not finite."""
    q, k, v = (torch.randn(BATCH, heads, LENGTH, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               .requires_grad_() for heads in (HEADS_Q, HEADS_KV, HEADS_KV))
    cases = masks(gen)
    calls = [dict(block_mask=mask, deterministic=True) for mask in cases.values()]
    for rows in (1, BATCH):
        bias = torch.randn(rows, HEADS_Q, LENGTH, PADDED, device="cuda", dtype=torch.bfloat16, generator=gen)
        calls.append(dict(block_mask=cases["token"], bias=bias[..., :LENGTH].requires_grad_()))
    for call in calls:
        out = omni_attention(q, k, v, **call)
        leaves = (q, k, v) + ((call["bias"],) if "bias" in call else ())
        for grad in torch.autograd.grad(out, leaves, torch.randn_like(out)):
            if not torch.isfinite(grad).all():
                raise SystemExit(f"a non-finite gradient at head dim {dim}")


if __name__ == "__main__":
    generator = torch.Generator("cuda").manual_seed(0)
    for head_dim in [int(arg) for arg in sys.argv[1:]] or [64, 128]:
        run(head_dim, generator)
    torch.cuda.synchronize()
    print("ok")
