"""Backward run twice eagerly and 20 times replayed in a CUDA graph on one VLM and one causal 8k case: dq, dk, dv
against the first call (relative error and relative difference of the sums of |x|).

    PYTHONPATH=. python benchmarks/results/issue16/session11/dq_determinism.py
"""
import sys

import torch

sys.path.insert(0, '.')
from benchmarks import layouts, measure  # noqa: E402
from omni_hf import _cuda  # noqa: E402
for name, S in (("vlm", 8192), ("causal", 8192)):
    layout = layouts.build(name, S); mask = layout.omni_mask(128, "cuda")
    gen = torch.Generator("cuda").manual_seed(S)
    q, k, v = (torch.randn(1, h, S, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for h in (32, 8, 8))
    dout = torch.randn_like(q); scale = 128 ** -0.5
    out, lse = _cuda.forward(q, k, v, mask, scale, None)
    a = _cuda.backward(dout, q, k, v, out, lse, mask, scale, None)
    b = _cuda.backward(dout, q, k, v, out, lse, mask, scale, None)
    graph, outs = measure.capture_graph(lambda: [_cuda.backward(dout, q, k, v, out, lse, mask, scale, None) for _ in range(10)])
    for _ in range(20): graph.replay()
    torch.cuda.synchronize()
    c = outs[-1]
    for tag, x in (("eager2", b), ("graph", c)):
        rel = [float((x[i].double() - a[i].double()).norm() / a[i].double().norm()) for i in range(3)]
        sums = [abs(float(x[i].double().abs().sum()) / float(a[i].double().abs().sum()) - 1) for i in range(3)]
        print(name, tag, "rel err dq dk dv", ["%.1e" % r for r in rel], "sum|.| rel diff", ["%.1e" % s for s in sums])
