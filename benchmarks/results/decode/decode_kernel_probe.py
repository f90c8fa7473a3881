"""One decoding step's attention, kernel time: omni's split-KV kernel against SDPA's FlashAttention-2 and cuDNN
backends, on `benchmarks.kernel_ab`'s "decode" cases (q_len 1 against a cache, 32 / 8 heads, head dims 64 and 128).
Each call is captured 10 times in a CUDA graph and the replay timed (median of do_bench / 10), so the host's launch
cost is left out; SDPA gets the KV heads as they are (enable_gqa), as Transformers hands them.

    python benchmarks/results/decode/decode_kernel_probe.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks import measure
from benchmarks.kernel_ab import CASE_SETS
from omni_hf import OmniBlockMask, omni_attention

CALLS = 10


def graph_us(step) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(CALLS):
                step()
    return measure.median_ms(graph.replay) * 1e3 / CALLS


print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for case in CASE_SETS["decode"]:
    gen = torch.Generator("cuda").manual_seed(case.seq_len)
    q = torch.randn(case.batch, case.heads_q, 1, case.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(case.batch, case.heads_kv, case.seq_len, case.head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=gen) for _ in range(2))
    mask = OmniBlockMask.causal(1, case.seq_len)
    times = {"omni": graph_us(lambda: omni_attention(q, k, v, mask))}
    for name, backend in (("sdpa-fa2", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                times[name] = graph_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        except RuntimeError as err:
            times[name] = float("nan")
            print(f"  {name}: {str(err).splitlines()[0][:100]}")
    # bytes of K and V the step reads, over the time
    gbs = 2 * k.numel() * k.element_size() / times["omni"] / 1e3
    print(f"{case.label}: omni {times['omni']:6.1f} us ({gbs:5.0f} GB/s), sdpa-fa2 {times['sdpa-fa2']:6.1f} us, "
          f"sdpa-cudnn {times['sdpa-cudnn']:6.1f} us; omni/fa2 speed {times['sdpa-fa2'] / times['omni']:.2f}",
          flush=True)
