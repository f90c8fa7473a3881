"""Session 9: decode split-KV slice count A/B: kernel us per call (CUDA graph of 50 calls) per library.
    python s9_decode_kernel_ab.py NAME=LIB.so ... [--rounds 3]"""
import json, os, statistics, subprocess, sys
CASES = [  # (batch, heads_q, heads_kv, q_len, kv_len, dim)
    (1, 32, 8, 1, 1088, 64), (8, 32, 8, 1, 1088, 64), (8, 32, 8, 1, 4096, 64), (32, 32, 8, 1, 1088, 64),
    (1, 16, 4, 1, 2048, 128), (1, 32, 8, 1, 32768, 128), (4, 32, 8, 1, 8192, 128), (8, 32, 8, 2, 2048, 64)]

def child():
    import torch
    sys.path.insert(0, os.getcwd())
    from benchmarks.bench_launch import gpu_us
    from omni_hf import OmniBlockMask, omni_attention
    out = []
    for b, hq, hkv, sq, skv, d in CASES:
        g = torch.Generator("cuda").manual_seed(0)
        q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
        k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        mask = OmniBlockMask.causal(sq, skv)
        with torch.no_grad():
            out.append(gpu_us(lambda: omni_attention(q, k, v, mask), 50))
    print(json.dumps(out))

if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(); sys.exit()
    libs = [a.split("=", 1) for a in sys.argv[1:] if "=" in a]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    res = {n: [] for n, _ in libs}
    for _ in range(rounds):
        for name, lib in libs:
            env = dict(os.environ, OMNI_HF_CUDA_LIB=os.path.abspath(lib))
            r = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
            res[name].append(json.loads(r.stdout.strip().splitlines()[-1]))
    print("| case (B, Hq, Hkv, q, kv, D) | " + " | ".join(n for n, _ in libs) + " |")
    for i, c in enumerate(CASES):
        print(f"| {c} | " + " | ".join(f"{statistics.median(r[i] for r in res[n]):.1f}" for n, _ in libs) + " |")
