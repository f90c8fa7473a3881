"""Greedy decoding in Transformers: omni against sdpa on its FlashAttention-2 backend, and omni's static-cache +
torch.compile path (CUDA graphs) against eager omni.

    python -m benchmarks.bench_decode [--batches 1,8] [--prompt 1024] [--new-tokens 64] [--emulate-precision-casts]
                                      [--out DIR]

A ~1B Llama from a config (random weights, bf16: hidden 2048, 16 layers, 32 query / 8 KV heads of 64, MLP 8192,
vocab 32000), prompts of ``--prompt`` random tokens, ``--new-tokens`` new tokens (min = max, so every run decodes
the same count). Per batch, tokens/s of the new tokens (median over ``--rounds`` rounds after a warm-up round; the
backends interleave within each round, so a noisy host hits them alike) for ``sdpa`` and ``omni``, each eager with
a dynamic cache (sdpa under ``sdpa_kernel(FLASH_ATTENTION)``), eager with a static cache, and with
``cache_implementation="static"`` compiled by generate (mode reduce-overhead: CUDA graphs; sdpa on its own choice
of backend there, since a static cache hands it a mask); and how many new tokens
the compiled run shares with the eager static-cache run before the first difference, for omni and for sdpa (random
weights give near ties, which Inductor's other rounding of the rest of the model can flip), with the eager run's
margin between its best and second-best logit at that step. With ``--emulate-precision-casts`` Inductor rounds its
fused intermediates to bf16 where eager does (``torch._inductor.config.emulate_precision_casts``), which takes most
of that other rounding away. Last, per batch, the same static-cache step compiled without Inductor (Dynamo's
``cudagraphs`` backend: the traced ATen ops as eager runs them, replayed from CUDA graphs): there omni's tokens and
logits must equal eager's exactly; sdpa's beside them need not (traced, Transformers hands it a mask and its own
choice of kernel). A table is printed last; JSON goes to ``--out`` (default $OUT, else benchmarks/results/).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch._inductor.config
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

import omni_hf  # noqa: F401  (registers "omni")

CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
              num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096)


def model_with(attn: str, state: dict | None) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation=attn)).to("cuda", torch.bfloat16).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def model_pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """The model on sdpa and on omni, with the same random weights."""
    sdpa = model_with("sdpa", None)
    return sdpa, model_with("omni", sdpa.state_dict())


def random_prompts(batch: int, length: int) -> torch.Tensor:
    """Random token ids ``[batch, length]`` int64 on the GPU, the same for a batch size at every call."""
    return torch.randint(3, CONFIG["vocab_size"], (batch, length), device="cuda",
                         generator=torch.Generator("cuda").manual_seed(batch))


def eager_context(model):
    """What an eager run with a dynamic cache needs: sdpa forced onto its FlashAttention-2 backend (that cache hands
    it no mask), nothing for omni."""
    sdpa = model.config._attn_implementation == "sdpa"
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION) if sdpa else contextlib.nullcontext()


def generate(model, prompts: torch.Tensor, new_tokens: int, **settings) -> tuple[float, dict]:
    """(seconds, {"ids": [B, prompt + new] int64, "logits": [new, B, vocab] float32}) of one greedy generation of
    exactly ``new_tokens`` tokens."""
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                  attention_mask=torch.ones_like(prompts), return_dict_in_generate=True, output_logits=True,
                  **settings)
    with torch.no_grad():
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(prompts, **kwargs)
        torch.cuda.synchronize()
    return time.perf_counter() - start, {"ids": out.sequences, "logits": torch.stack(out.logits).float()}


def agreement(run: dict, eager: dict, prompt: int) -> dict:
    """How far ``run`` decodes the tokens of ``eager`` (same prompts): new tokens shared before the first difference
    (least over the batch), eager's margin between its best and second-best logit at that step in the row that
    differs first (None when none differs), and the largest logit difference over the steps up to that one (whose
    inputs were still the same tokens)."""
    differs = (run["ids"][:, prompt:] != eager["ids"][:, prompt:]).int()
    first = torch.where(differs.any(1), differs.argmax(1), differs.shape[1])
    same, row = int(first.min()), int(first.argmin())
    margin = None
    if same < differs.shape[1]:
        top2 = eager["logits"][same, row].topk(2).values
        margin = float(top2[0] - top2[1])
    gap = float((run["logits"][:same + 1] - eager["logits"][:same + 1]).abs().max())
    return {"same_new_tokens": same, "margin_at_difference": margin, "max_logit_difference": gap}


def cudagraphs_backend_agreement(model, prompts: torch.Tensor, new_tokens: int, eager: dict) -> dict:
    """`agreement` of static-cache decoding compiled by Dynamo's ``cudagraphs`` backend (ATen ops as eager runs
    them, replayed from CUDA graphs) with eager static-cache decoding; also what Dynamo counted: graphs compiled,
    graph breaks and CUDA-graph skips (0: every compiled step ran as a graph)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    config = CompileConfig(backend="cudagraphs", mode="default")
    for _ in range(2):  # the first run compiles and records; the second replays
        _, run = generate(model, prompts, new_tokens, cache_implementation="static", compile_config=config)
    result = agreement(run, eager, prompts.shape[1])
    result["compiled_graphs"] = counters["stats"]["unique_graphs"]
    result["graph_breaks"] = sum(counters["graph_break"].values())
    result["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
    torch._dynamo.reset()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds, backends interleaved in each")
    parser.add_argument("--emulate-precision-casts", action="store_true",
                        help="compile with Inductor rounding its intermediates to bf16 as eager does")
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results")
    args = parser.parse_args(argv)
    torch._inductor.config.emulate_precision_casts = args.emulate_precision_casts
    sdpa, omni = model_pair()
    rows = []
    for batch in map(int, args.batches.split(",")):
        prompts = random_prompts(batch, args.prompt)
        runs = {
            "sdpa_fa2": lambda: generate(sdpa, prompts, args.new_tokens, disable_compile=True),
            "omni": lambda: generate(omni, prompts, args.new_tokens, disable_compile=True),
            "omni_static": lambda: generate(omni, prompts, args.new_tokens, disable_compile=True,
                                            cache_implementation="static"),
            "omni_static_compiled": lambda: generate(omni, prompts, args.new_tokens, cache_implementation="static"),
            "sdpa_static": lambda: generate(sdpa, prompts, args.new_tokens, disable_compile=True,
                                            cache_implementation="static"),
            "sdpa_static_compiled": lambda: generate(sdpa, prompts, args.new_tokens, cache_implementation="static"),
        }
        seconds, outputs = {name: [] for name in runs}, {}
        for round_ in range(args.rounds + 1):  # the first warms up (and compiles); every round interleaves the backends
            for name, run in runs.items():
                # FlashAttention takes no mask: forced for the dynamic cache only (a static cache hands sdpa one)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION) if name == "sdpa_fa2" else contextlib.nullcontext():
                    elapsed, outputs[name] = run()
                if round_ > 0:
                    seconds[name].append(elapsed)
        row = {"batch": batch, **{f"{name}_tok_s": batch * args.new_tokens / statistics.median(times)
                                  for name, times in seconds.items()}}
        for name in ("omni", "sdpa"):
            row[f"{name}_compiled"] = agreement(outputs[f"{name}_static_compiled"], outputs[f"{name}_static"],
                                                args.prompt)
        row["omni_vs_sdpa_same_new_tokens"] = agreement(outputs["omni"], outputs["sdpa_fa2"],
                                                        args.prompt)["same_new_tokens"]
        for name, model in (("omni", omni), ("sdpa", sdpa)):
            row[f"{name}_cudagraphs_backend"] = cudagraphs_backend_agreement(model, prompts, args.new_tokens,
                                                                       outputs[f"{name}_static"])
        rows.append(row)
        print(row, flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": CONFIG,
            "prompt": args.prompt, "new_tokens": args.new_tokens,
            "emulate_precision_casts": args.emulate_precision_casts,
            "command": "python -m benchmarks.bench_decode " + " ".join(argv or sys.argv[1:])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decode.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"{meta['device']}, torch {meta['torch']}, Llama ~1B bf16, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens")
    print("| batch | sdpa FA2 tok/s | omni tok/s | omni / sdpa | static+compile tok/s omni / sdpa | same new tokens, "
          "Inductor vs eager static: omni / sdpa (eager's top-2 margin there) | same new tokens, cudagraphs backend "
          "vs eager static: omni / sdpa (largest logit difference) |")
    print("|---|---|---|---|---|---|---|")

    def inductor(a: dict) -> str:
        return f"{a['same_new_tokens']}" + ("" if a["margin_at_difference"] is None else
                                              f" ({a['margin_at_difference']:.3f})")

    def plain(a: dict) -> str:
        return f"{a['same_new_tokens']} ({a['max_logit_difference']:.1e})"

    for r in rows:
        print(f"| {r['batch']} | {r['sdpa_fa2_tok_s']:.0f} | {r['omni_tok_s']:.0f} | "
              f"{r['omni_tok_s'] / r['sdpa_fa2_tok_s']:.2f} | {r['omni_static_compiled_tok_s']:.0f} / "
              f"{r['sdpa_static_compiled_tok_s']:.0f} | {inductor(r['omni_compiled'])} / "
              f"{inductor(r['sdpa_compiled'])} of {args.new_tokens} | {plain(r['omni_cudagraphs_backend'])} / "
              f"{plain(r['sdpa_cudagraphs_backend'])} of {args.new_tokens} |")

if __name__ == "__main__":
    main()
