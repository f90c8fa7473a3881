"""One SigLIP attention call of Gemma-3-4B's tower from pixels (39 images of 4096 patches, 16 heads of 72, bf16,
[B, S, H, D] projections seen as [B, H, S, D], no grad): sdpa's backends at head dim 72 against omni, which runs
its head dim 96 kernel reading the 72 columns as they are, and the same kernel on inputs already 96 wide (zero
columns appended by three pad copies, also timed: what the op did before the kernels read true widths).

    python benchmarks/results/vlm_training/tower_attention.py [IMAGES]

Median milliseconds of `triton.testing.do_bench`, TFLOP/s over the call's true work (4 B H S^2 72), and the time of
the tower's 27 layers.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from omni_hf import OmniBlockMask, omni_attention

LAYERS, PATCHES, HEADS, HEAD_DIM, KERNEL_DIM = 27, 4096, 16, 72, 96


def projections(images: int, head_dim: int) -> list[torch.Tensor]:
    """q, k, v [images, HEADS, PATCHES, head_dim] bf16, transposed views of [images, PATCHES, HEADS, head_dim]."""
    return [torch.randn(images, PATCHES, HEADS, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            for _ in range(3)]


def main(images: int) -> None:
    q, k, v = projections(images, HEAD_DIM)
    wide = [F.pad(t.transpose(1, 2), (0, KERNEL_DIM - HEAD_DIM)).transpose(1, 2) for t in (q, k, v)]
    mask = OmniBlockMask.full(PATCHES)
    scale = HEAD_DIM ** -0.5

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, scale=scale)
        return run

    rows = {
        "sdpa cuDNN (D 72)": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa flash (D 72)": sdpa(SDPBackend.FLASH_ATTENTION),
        "omni (D 72, on the 96 kernel)": lambda: omni_attention(q, k, v, mask, scale=scale),
        "omni kernel alone (inputs 96 wide)": lambda: omni_attention(*wide, mask, scale=scale),
        "three pad copies to 96": lambda: [F.pad(t.transpose(1, 2), (0, KERNEL_DIM - HEAD_DIM)) for t in (q, k, v)],
    }
    flops = 4 * images * HEADS * PATCHES**2 * HEAD_DIM
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {images} images x {HEADS} heads x "
          f"{PATCHES} patches, head dim {HEAD_DIM}")
    print(f"{'call':38s} {'ms':>8s} {'TFLOP/s':>8s} {'27 layers, ms':>14s}")
    with torch.no_grad():
        cudnn = rows["sdpa cuDNN (D 72)"]().float()
        print(f"largest |omni - cuDNN|: {(omni_attention(q, k, v, mask, scale=scale).float() - cudnn).abs().max():.2e}")
        for name, fn in rows.items():
            ms = do_bench(fn, warmup=50, rep=300, return_mode="median")
            print(f"{name:38s} {ms:8.3f} {flops / ms / 1e9:8.0f} {ms * LAYERS:14.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 39)
