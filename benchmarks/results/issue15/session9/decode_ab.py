"""Session 9: eager decoding tok/s, omni vs sdpa-FA2 with an sdpa-vs-sdpa control, many interleaved rounds."""
import contextlib, os, statistics, sys
sys.path.insert(0, os.getcwd())
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from benchmarks.bench_decode import CONFIG, model_with, generate

rounds, new = int(sys.argv[1]), int(sys.argv[2])
sdpa = model_with("sdpa", None)
omni = model_with("omni", sdpa.state_dict())
for batch in (1, 8):
    prompts = torch.randint(3, CONFIG["vocab_size"], (batch, 1024), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(batch))
    runs = {"sdpa": sdpa, "omni": omni, "sdpa_again": sdpa}
    secs = {name: [] for name in runs}
    for rnd in range(rounds + 1):
        for name, model in runs.items():
            ctx = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name.startswith("sdpa") else contextlib.nullcontext()
            with ctx:
                t = generate(model, prompts, new, disable_compile=True)[0]
            if rnd:
                secs[name].append(t)
    tok = {n: batch * new / statistics.median(v) for n, v in secs.items()}
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(secs[b], secs[a]))  # per-round a/b in tok/s
    q = lambda a, b: sorted(x / y for x, y in zip(secs[b], secs[a]))
    print(f"batch {batch}: tok/s " + ", ".join(f"{n} {v:.0f}" for n, v in tok.items())
          + f"; per-round omni/sdpa median {ratio('omni', 'sdpa'):.3f} (sorted {[round(x, 3) for x in q('omni', 'sdpa')]})"
          + f"; control sdpa_again/sdpa median {ratio('sdpa_again', 'sdpa'):.3f}", flush=True)
