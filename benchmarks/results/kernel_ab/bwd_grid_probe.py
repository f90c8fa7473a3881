"""Backward kernel time of the library OMNI_HF_CUDA_LIB names at causal / VLM, head dim 128, 32 query heads over 32
KV heads (one query head per CTA) and over 8 (a CTA walks its 4 query heads): the probe behind
bwd_grid_order_h100.log."""
import sys
sys.path.insert(0, ".")
from benchmarks.kernel_ab import Case, measure_case
for mask in ("causal", "vlm"):
    for S in (8192, 16384, 32768):
        for hkv in (32, 8):
            r = measure_case(Case(mask, S, 1, 32, hkv, 128, "bfloat16"), "bwd")
            print(f"{r['case']}: {r['kernel_us']:.0f} us {r['tflops']:.0f} TF", flush=True)
