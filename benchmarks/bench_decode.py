"""Greedy decoding in Transformers: omni against sdpa on its FlashAttention-2 backend, and omni's static-cache +
torch.compile path (CUDA graphs) against eager omni.

    python benchmarks/bench_decode.py [--batches 1,8] [--prompt 1024] [--new-tokens 64] [--out DIR]

A ~1B Llama from a config (random weights, bf16: hidden 2048, 16 layers, 32 query / 8 KV heads of 64, MLP 8192,
vocab 32000), prompts of ``--prompt`` random tokens, ``--new-tokens`` new tokens (min = max, so every run decodes
the same count). Reported per batch: tokens/s of the new tokens (median of 3 timed runs after a warm-up) for
``sdpa`` under ``sdpa_kernel(FLASH_ATTENTION)``, ``omni`` eager (dynamic cache), ``omni`` with
``cache_implementation="static"`` compiled by generate (mode reduce-overhead: CUDA graphs), and whether the compiled
omni's tokens equal eager omni's with the same static cache and with a dynamic cache. A table is printed last; JSON goes to ``--out`` (default $OUT, else
benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import omni_hf  # noqa: E402,F401  (registers "omni")

CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
              num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096)


def model_with(attn: str, state: dict | None) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation=attn)).to("cuda", torch.bfloat16).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def timed_generate(model, prompts: torch.Tensor, new_tokens: int, runs: int = 3, **settings) -> tuple[float, torch.Tensor]:
    """(new tokens per second, median of ``runs`` after one warm-up, and the generated ids)."""
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                  attention_mask=torch.ones_like(prompts), **settings)
    with torch.no_grad():
        out = model.generate(prompts, **kwargs)
        times = []
        for _ in range(runs):
            torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(prompts, **kwargs)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return prompts.shape[0] * new_tokens / statistics.median(times) if times else float("nan"), out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results")
    args = parser.parse_args(argv)
    sdpa = model_with("sdpa", None)
    omni = model_with("omni", sdpa.state_dict())
    rows = []
    for batch in map(int, args.batches.split(",")):
        prompts = torch.randint(3, CONFIG["vocab_size"], (batch, args.prompt), device="cuda",
                                generator=torch.Generator("cuda").manual_seed(batch))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sdpa_tps, _ = timed_generate(sdpa, prompts, args.new_tokens, disable_compile=True)
        omni_tps, eager_ids = timed_generate(omni, prompts, args.new_tokens, disable_compile=True)
        _, eager_static_ids = timed_generate(omni, prompts, args.new_tokens, runs=0, disable_compile=True,
                                             cache_implementation="static")
        static_tps, static_ids = timed_generate(omni, prompts, args.new_tokens, cache_implementation="static")
        rows.append({"batch": batch, "sdpa_fa2_tok_s": sdpa_tps, "omni_tok_s": omni_tps,
                     "omni_static_compiled_tok_s": static_tps,
                     "compiled_equals_eager_static": bool(torch.equal(static_ids, eager_static_ids)),
                     "compiled_equals_eager_dynamic": bool(torch.equal(static_ids, eager_ids))})
        print(rows[-1], flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": CONFIG,
            "prompt": args.prompt, "new_tokens": args.new_tokens,
            "command": "python benchmarks/bench_decode.py " + " ".join(argv or sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"{meta['device']}, torch {meta['torch']}, Llama ~1B bf16, prompt {args.prompt}, {args.new_tokens} new tokens")
    print("| batch | sdpa FA2 tok/s | omni tok/s | omni / sdpa | omni static+compile tok/s | tokens == eager static "
          "/ dynamic |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['sdpa_fa2_tok_s']:.0f} | {r['omni_tok_s']:.0f} | "
              f"{r['omni_tok_s'] / r['sdpa_fa2_tok_s']:.2f} | {r['omni_static_compiled_tok_s']:.0f} | "
              f"{r['compiled_equals_eager_static']} / {r['compiled_equals_eager_dynamic']} |")


if __name__ == "__main__":
    main()
