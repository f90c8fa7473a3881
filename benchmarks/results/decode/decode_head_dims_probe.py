"""One decoding step's attention (q_len 1 against a KV cache) at head dims 128 and 256, omni vs SDPA's backends,
kernel time by triton.testing.do_bench (median). Head dim 256 (Gemma 2 / 3: 8 / 4 heads) has no split-KV decode
instantiation, so omni runs it on the forward kernel; 128 (32 / 8 heads) takes the decode path."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from omni_hf import OmniBlockMask, omni_attention

print(torch.cuda.get_device_name(), torch.__version__)
for dim, heads_q, heads_kv in ((128, 32, 8), (256, 8, 4)):
    for batch in (1, 8):
        for kv_len in (1024, 8192):
            q = torch.randn(batch, heads_q, 1, dim, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(batch, heads_kv, kv_len, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            mask = OmniBlockMask.causal(1, kv_len)
            omni = do_bench(lambda: omni_attention(q, k, v, mask), return_mode="median") * 1e3
            kr, vr = (t.repeat_interleave(heads_q // heads_kv, 1) for t in (k, v))
            best = {}
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                                  ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        best[name] = do_bench(lambda: F.scaled_dot_product_attention(q, kr, vr), return_mode="median") * 1e3
                except RuntimeError:
                    pass
            name, t = min(best.items(), key=lambda kv: kv[1])
            print(f"D{dim} H{heads_q}/{heads_kv} B{batch} kv {kv_len}: omni {omni:7.1f} us, sdpa best ({name}) {t:7.1f} us,"
                  f" omni/sdpa time {omni / t:.2f}")
