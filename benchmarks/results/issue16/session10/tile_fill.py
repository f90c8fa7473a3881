"""How full the visited 128 x 128 tiles of the suite's VLM and causal masks are: allowed pairs / (visited tiles x
128 x 128), and the share of PARTIAL tiles (CPU only, from the benchmark's own layouts and omni's mask builder).

    PYTHONPATH=. python benchmarks/results/issue16/session10/tile_fill.py
"""

from __future__ import annotations

import torch

from benchmarks import layouts
from omni_hf import BlockType, OmniBlockMask

BLOCK = 128


def main() -> None:
    for name in ("vlm", "causal"):
        for seq_len in (8192, 16384, 32768):
            layout = layouts.build(name, seq_len)
            # the causal layout's own mask is implicit (no lists): the token rule of one text document lists it
            mask = OmniBlockMask.from_token_ids(*layout.token_ids("cpu"), block_q=BLOCK, block_kv=BLOCK)
            num = mask.kv_num_blocks[0, 0]
            types = mask.kv_types[0, 0]
            active = torch.arange(types.shape[-1])[None] < num[:, None]
            tiles = int(num.sum())
            partial = int(((types == int(BlockType.PARTIAL)) & active).sum())
            fill = layout.allowed_pairs() / (tiles * BLOCK * BLOCK)
            print(f"{name:6} S{seq_len:6}: {tiles:6} tiles ({tiles / (seq_len // BLOCK):5.1f} per query block), "
                  f"PARTIAL {partial / tiles:5.1%}, fill {fill:.3f}")


if __name__ == "__main__":
    main()
