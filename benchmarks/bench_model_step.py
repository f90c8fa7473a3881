"""Whole training steps of two model families whose attention omni newly serves: omni vs the other backends.

    python -m benchmarks.bench_model_step                      # both archs, every backend, default sizes
    python -m benchmarks.bench_model_step --archs gpt-oss-shaped --length 8192 16384 --attn omni flex_attention
    python -m benchmarks.bench_model_step --archs t5-base-sized --encoder-length 4096 --batch 2
    python -m benchmarks.bench_model_step --tiny               # tiny configs on the CPU (the CI check)

Architectures (Transformers' own modeling code, random init from ``--seed``, bf16 on a GPU; float32 on the CPU,
where omni runs its exact PyTorch reference):

- ``gpt-oss-shaped``: `transformers.GptOssConfig` at gpt-oss's widths with fewer layers and experts: hidden 2880,
  4 layers alternating sliding window 128 and full attention (``layer_types``), 64 query / 8 KV heads of head dim
  64, 8 experts top-2 of intermediate size 2880 (the released models: 128 / 32 experts top-4), vocabulary 32000
  (gpt-oss's 201088 would add 1 B parameters of embeddings and LM head, the same work under every backend, and
  leave eager's dense 64 x 8192^2 scores no room), learnable attention sinks (``s_aux``, which omni takes as
  ``sinks``). One row of ``--length`` random token ids (default 8192), the labels the ids. Activation
  checkpointing (non-reentrant) on, as a long row of this model trains: without it eager keeps four layers of
  scores, 64 x 8192^2 each in several copies.
- ``t5-base-sized``: `transformers.T5ForConditionalGeneration` with T5-base's config (d_model 768, 12 + 12 layers,
  12 heads of 64, d_ff 3072, ReLU, vocab 32128, 32 relative-position buckets): an additive relative position bias
  (``position_bias``, made by the first layer of each stack and shared by the others, with a gradient) which omni
  takes as ``bias``. ``--batch`` rows (default 4: what a T5-base fine-tune on 2k-token inputs fits on one GPU without
  accumulation, 8k input tokens a step) of ``--encoder-length`` random ids (default 2048) and ``--decoder-length``
  random labels (default 512, the decoder's inputs shifted from them by the model). Dropout 0 (omni takes no
  attention dropout), no activation checkpointing (a T5-base fine-tune fits without it).

Backends (``--attn``; default per arch: gpt-oss ``omni eager flex_attention sdpa``, T5 ``omni sdpa eager``):
``omni``; ``eager`` (Transformers' reference: dense scores, the sinks as an extra softmax column, the bias added);
``flex_attention`` (Transformers' flex path: its own ``BlockMask``, the sinks by renormalising with the LSE, the
bias in a ``score_mod``); ``sdpa`` (T5: the bias and the mask as one float ``attn_mask``; gpt-oss: refused by
Transformers, no sinks). A backend the model refuses when it is built is recorded as ``skipped`` with the reason;
an error or an out-of-memory in a step as ``error`` / ``oom``.

A step: forward with labels, ``loss.backward()``, AdamW (fused on a GPU) and ``zero_grad``, by
`benchmarks.bench_vlm_training.train_step`. ``--warmup`` untimed steps (default 3; compiles Flex), then ``--steps``
timed ones (default 10), each synchronised and timed by the host clock: ``ms`` is the median step, ``tokens_per_s``
the step's tokens (gpt-oss: length; T5: batch x (encoder + decoder length)) over it, ``peak_gib`` the peak of
``torch.cuda.max_memory_allocated`` over the timed steps (the weights, gradients and AdamW states included).
``loss`` is the first step's (warm-up included): the same seed gives every backend the same weights and inputs, so
the losses compare the backends' attention; the table prints each backend's loss minus eager's (omni's must stay
within 1e-3). One progress line per case, the table last (omni's speedup: omni's tokens/s over each backend's); the
JSON (``model_step_<archs>_<lengths>_<backends>[_tiny].json``, rewritten after every case, with the environment:
device, torch, transformers, command, date) goes to ``--out`` (default ``$OUT``, else
benchmarks/results/model_step/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

import omni_hf  # noqa: F401 -- registers attn_implementation="omni"
from benchmarks.bench_vlm_training import (
    failure,
    free_memory,
    optimizer_for,
    peak_gib,
    start_run,
    synchronize,
    train_step,
)

RESULTS = Path(__file__).resolve().parent / "results" / "model_step"
BACKENDS = ("omni", "eager", "flex_attention", "sdpa")
LOSS_TOLERANCE = 1e-3  # |omni's first loss - eager's|


# ---------------------------------------------------------------------- architectures


def gpt_oss_shaped(tiny: bool) -> transformers.GptOssConfig:
    """gpt-oss's attention and expert widths in 4 layers of 8 experts (tiny: 2 layers of 64, window 32)."""
    if tiny:
        sizes = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_local_experts=4, vocab_size=512, sliding_window=32)
    else:
        sizes = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=4, num_attention_heads=64,
                     num_key_value_heads=8, head_dim=64, num_local_experts=8, vocab_size=32000, sliding_window=128)
    layers = sizes["num_hidden_layers"]
    return transformers.GptOssConfig(**sizes, num_experts_per_tok=2, attention_dropout=0.0, use_cache=False,
                                     layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                                                  for i in range(layers)])


def t5_base_sized(tiny: bool) -> transformers.T5Config:
    """T5-base (tiny: 2 + 2 layers of 64, 4 heads of 16, vocab 512)."""
    if tiny:
        sizes = dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4)
    else:
        sizes = dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_decoder_layers=12,
                     num_heads=12)
    return transformers.T5Config(**sizes, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                                 dropout_rate=0.0, feed_forward_proj="relu", tie_word_embeddings=True,
                                 is_encoder_decoder=True, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                                 use_cache=False)


@dataclasses.dataclass(frozen=True)
class Arch:
    """A model family: its config (``tiny`` or not), the class built from it, the backends it runs by default and
    whether its layers are checkpointed."""

    config: Callable[[bool], transformers.PretrainedConfig]
    auto_class: str  # the Auto class of transformers that builds it
    backends: tuple[str, ...]
    checkpointing: bool
    encoder_decoder: bool


ARCHS = {
    "gpt-oss-shaped": Arch(gpt_oss_shaped, "AutoModelForCausalLM", BACKENDS, True, False),
    "t5-base-sized": Arch(t5_base_sized, "AutoModelForSeq2SeqLM", ("omni", "sdpa", "eager"), False,
                          True),
}


# ---------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: an arch at a length (the encoder's for T5) on a backend."""

    arch: str
    length: int
    attn: str
    decoder_length: int | None = None  # T5
    batch: int = 1

    @property
    def tokens(self) -> int:
        return self.batch * (self.length + (self.decoder_length or 0))

    def record(self) -> dict:
        record = {"arch": self.arch, "length": self.length, "attn": self.attn}
        if self.decoder_length is not None:
            record |= {"decoder_length": self.decoder_length, "batch": self.batch}
        return record


def cases(args: Args) -> list[Case]:
    """Every arch x length x backend of the run, in that order (``args.attn`` None: each arch's own backends)."""
    out = []
    for arch in args.archs:
        backends = args.attn or ARCHS[arch].backends
        if ARCHS[arch].encoder_decoder:
            out += [Case(arch, n, attn, args.decoder_length, args.batch) for n in args.encoder_lengths
                    for attn in backends]
        else:
            out += [Case(arch, n, attn) for n in args.lengths for attn in backends]
    return out


def build_model(case: Case, tiny: bool, seed: int, device: torch.device, dtype: torch.dtype):
    """The arch on ``case.attn`` with random weights from ``seed`` (the same for every backend), in train mode,
    checkpointed where the arch is."""
    arch = ARCHS[case.arch]
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, arch.auto_class).from_config(arch.config(tiny), attn_implementation=case.attn,
                                                                   dtype=dtype)
    if arch.checkpointing:
        checkpointing = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        checkpointing({"use_reentrant": False})  # gradient_checkpointing_enable before its rename in Transformers 5.2x
    return model.train()


def step_inputs(case: Case, vocab: int, seed: int, device: torch.device) -> dict:
    """Random token ids from ``seed``, the same for every backend: gpt-oss a row with its ids as labels; T5 encoder
    ids and decoder labels (never the pad id 0, so every position counts)."""
    gen = torch.Generator().manual_seed(seed)

    def ids(length: int) -> torch.Tensor:
        return torch.randint(1, vocab, (case.batch, length), generator=gen).to(device)

    if case.decoder_length is None:
        row = ids(case.length)
        return {"input_ids": row, "labels": row, "use_cache": False}
    return {"input_ids": ids(case.length), "labels": ids(case.decoder_length), "use_cache": False}


class Refused(Exception):
    """The model would not build on the backend (Transformers' or omni's check of what the model needs)."""


def run_case(case: Case, args: Args, context: dict) -> dict:
    """The case's record: its speed, first loss and peak memory, or why it did not run."""
    record = case.record() | {"checkpointing": ARCHS[case.arch].checkpointing}
    free_memory()
    try:
        record |= _timed_steps(case, args, context)
    except Refused as refusal:
        record |= {"status": "skipped", "reason": str(refusal)}
    except Exception as error:  # noqa: BLE001 -- recorded: an OOM, or a backend that cannot run the case
        record |= failure(error)
    free_memory()  # the case's model, optimizer and activations went with `_timed_steps`'s frame
    return record


def _timed_steps(case: Case, args: Args, context: dict) -> dict:
    device, dtype = context["device"], context["dtype"]
    try:
        model = build_model(case, args.tiny, args.seed, device, dtype)
    except ValueError as error:  # Transformers' and omni's refusals of an implementation the model cannot take
        raise Refused(f"{type(error).__name__}: {str(error).splitlines()[0][:300]}") from None
    inputs = step_inputs(case, model.config.vocab_size, args.seed, device)
    optimizer = optimizer_for(model)
    losses, times = [], []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            synchronize()
            free_memory()  # the peak of the timed steps only
        start = time.perf_counter()
        losses.append(train_step(model, optimizer, inputs))  # .item(): synchronises
        synchronize()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times[args.warmup:])
    return {"status": "ok", "ms": round(1e3 * step_s, 1), "tokens_per_s": round(case.tokens / step_s),
            "loss": losses[0], "peak_gib": peak_gib(), "tokens": case.tokens, "steps": args.steps,
            "warmup": args.warmup, "losses": losses}


def loss_gaps(records: list[dict]) -> None:
    """Sets ``loss_minus_eager`` (the first step's) and ``last_loss_minus_eager`` (the last step's: by then the
    gradients of the steps before, which went through attention, have moved the weights) on every record that ran
    beside an eager record of the same arch and sizes."""
    eager = {_sizes(r): r for r in records if r["attn"] == "eager" and r.get("status") == "ok"}
    for r in records:
        if r["attn"] != "eager" and r.get("status") == "ok" and _sizes(r) in eager:
            base = eager[_sizes(r)]
            r["loss_minus_eager"] = r["loss"] - base["loss"]
            if len(r["losses"]) == len(base["losses"]) > 1:
                r["last_loss_minus_eager"] = r["losses"][-1] - base["losses"][-1]


def _sizes(record: dict) -> tuple:
    return record["arch"], record["length"], record.get("decoder_length"), record.get("batch")


# ---------------------------------------------------------------------- report


def progress(record: dict) -> str:
    """One line of a case: its speed, loss and memory, or its status and reason."""
    head = f"{record['arch']} {record['length']}" + (f"+{record['decoder_length']} x{record['batch']}"
                                                      if "decoder_length" in record else "") + f" {record['attn']}: "
    if record["status"] == "ok":
        peak = "" if record["peak_gib"] is None else f", peak {record['peak_gib']} GiB"
        return head + f"{record['tokens_per_s']:,} tok/s, {record['ms']} ms, loss {record['loss']:.6f}{peak}"
    return head + record["status"] + (f" ({record.get('reason') or record.get('error')})"
                                      if "reason" in record or "error" in record else "")


def table(records: list[dict]) -> str:
    """Per arch and sizes, a row per backend: tokens/s, ms, loss and its gap to eager, peak GiB and omni's speedup
    (omni's tokens/s over the backend's); then omni's loss against eager's."""
    header = (f"{'arch':16s} {'length':>13s} {'attn':15s} {'tokens/s':>10s} {'ms':>9s} {'loss':>10s} "
              f"{'- eager':>9s} {'peak GiB':>8s} {'omni x':>6s}")
    lines = [header, "-" * len(header)]
    checks = []
    for sizes in dict.fromkeys(_sizes(r) for r in records):
        cells = [r for r in records if _sizes(r) == sizes]
        omni = next((r for r in cells if r["attn"] == "omni" and r["status"] == "ok"), None)
        for r in cells:
            length = str(r["length"]) + (f"+{r['decoder_length']}x{r['batch']}" if "decoder_length" in r else "")
            lead = f"{r['arch']:16s} {length:>13s} {r['attn']:15s} "
            if r["status"] != "ok":
                why = r.get("reason") or r.get("error") or ""
                lines.append(lead + f"{r['status']}" + (f": {why[:90]}" if why else ""))
                continue
            gap = f"{r['loss_minus_eager']:+9.1e}" if "loss_minus_eager" in r else f"{'':9s}"
            speedup = (f"{omni['tokens_per_s'] / r['tokens_per_s']:5.2f}x" if omni is not None and r is not omni
                       else f"{'':6s}")
            peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
            lines.append(lead + f"{r['tokens_per_s']:>10,} {r['ms']:>9.1f} {r['loss']:>10.5f} {gap} {peak:>8s} "
                                f"{speedup}")
        if omni is not None and "loss_minus_eager" in omni:
            gap = omni["loss_minus_eager"]
            verdict = "within" if abs(gap) <= LOSS_TOLERANCE else "EXCEEDS"
            last = (f"; after {len(omni['losses'])} steps {omni['last_loss_minus_eager']:+.2e}"
                    if "last_loss_minus_eager" in omni else "")
            checks.append(f"{omni['arch']} {omni['length']}: omni's first loss - eager's = {gap:+.2e} ({verdict} "
                          f"{LOSS_TOLERANCE:.0e}){last}")
    return "\n".join(lines + checks)


# ---------------------------------------------------------------------- command line


@dataclasses.dataclass(frozen=True)
class Args:
    archs: tuple[str, ...]
    attn: tuple[str, ...] | None  # None: each arch's own backends
    lengths: tuple[int, ...]
    encoder_lengths: tuple[int, ...]
    decoder_length: int
    batch: int
    steps: int
    warmup: int
    tiny: bool
    seed: int
    out: Path


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", choices=list(ARCHS), default=list(ARCHS))
    parser.add_argument("--attn", nargs="+", choices=list(BACKENDS), default=None,
                        help="backends for every arch (default: gpt-oss omni eager flex_attention sdpa; T5 omni sdpa "
                             "eager)")
    parser.add_argument("--length", nargs="+", type=int, default=None, help="gpt-oss row lengths (default 8192; tiny "
                                                                             "256)")
    parser.add_argument("--encoder-length", nargs="+", type=int, default=None,
                        help="T5 encoder lengths (default 2048; tiny 256)")
    parser.add_argument("--decoder-length", type=int, default=None, help="T5 decoder labels (default 512; tiny 64)")
    parser.add_argument("--batch", type=int, default=None, help="T5 rows per step (default 4; tiny 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per case (default 10, tiny 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3, tiny 1)")
    parser.add_argument("--tiny", action="store_true", help="tiny configs and lengths, on the CPU unless a GPU is "
                                                            "there")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT or "
                                                               "benchmarks/results/model_step)")
    a = parser.parse_args(argv)

    def default(value, real, small):
        return value if value is not None else (small if a.tiny else real)

    if default(a.steps, 10, 2) < 1:
        parser.error("--steps: at least 1")
    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS)
    return Args(tuple(a.archs), tuple(a.attn) if a.attn else None, tuple(default(a.length, [8192], [256])),
                tuple(default(a.encoder_length, [2048], [256])), default(a.decoder_length, 512, 64),
                default(a.batch, 4, 2), default(a.steps, 10, 2), default(a.warmup, 3, 1), a.tiny, a.seed, out)


def result_name(args: Args) -> str:
    """``model_step_<archs>_<lengths>_<backends>[_tiny].json``: runs of other archs, lengths or backends never
    overwrite each other."""
    lengths = [str(n) for n in args.lengths] if "gpt-oss-shaped" in args.archs else []
    if "t5-base-sized" in args.archs:
        lengths += [f"{n}-{args.decoder_length}x{args.batch}" for n in args.encoder_lengths]
    fields = [args.archs, lengths, args.attn or ("default",)]
    return "_".join(["model_step", *("-".join(field) for field in fields)]) + ("_tiny" if args.tiny else "") + ".json"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    context, result = start_run("benchmarks.bench_model_step", argv)
    path = args.out / result_name(args)
    args.out.mkdir(parents=True, exist_ok=True)
    todo = cases(args)
    for index, case in enumerate(todo, 1):
        start = time.time()
        result["records"].append(run_case(case, args, context))
        loss_gaps(result["records"])
        print(f"[{index}/{len(todo)}] {progress(result['records'][-1])} ({time.time() - start:.0f} s)", flush=True)
        path.write_text(json.dumps(result, indent=1) + "\n")  # after every case: a run cut short keeps its results
    print(table(result["records"]))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
