"""Packed rows split across ranks, trained by ``transformers.Trainer`` (or TRL's ``SFTTrainer``) with omni's context
parallelism: `omni_hf.distributed.ContextParallelMixin` in front of the trainer class.

    torchrun --nproc-per-node 2 examples/trainer_context_parallel.py                  # CPU (gloo), tiny Llama, cp=2
    torchrun --nproc-per-node 4 examples/trainer_context_parallel.py --cp 2           # 2 rows at a time, 2 ranks each
    torchrun --nproc-per-node 2 examples/trainer_context_parallel.py --trainer sft    # TRL's SFTTrainer
    python examples/trainer_context_parallel.py --cp 1                                # one process, whole rows

On GPUs, a TinyLlama-sized model (random bf16 weights, activation checkpointing) on rows of 64k tokens, one process
and then two, the second compared with the first:

    python examples/trainer_context_parallel.py --device cuda --model tinyllama-1.1b --length 65536 --batch 32 \
        --steps 4 --warmup 1 --json one.json
    torchrun --nproc-per-node 2 examples/trainer_context_parallel.py --device cuda --model tinyllama-1.1b \
        --length 65536 --batch 32 --steps 4 --warmup 1 --baseline one.json --json two.json

Synthetic samples (text with a bidirectional image span each) are packed by `OmniCollator`, ``--batch`` per rank of a
row and step. ``--json`` writes every micro-batch's loss (averaged over the ranks, as Trainer logs it), the steps'
times and tokens/s, and ``--weights`` the trained weights (rank 0), for comparing with one process
(tests/distributed/test_trainer_context_parallel.py); with ``--baseline`` (one process's JSON) it adds the
``speedup`` and the largest relative difference of the losses (``loss_rel_diff``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainerCallback, TrainingArguments

import omni_hf  # noqa: F401  (registers attn_implementation="omni")
from omni_hf import OmniCollator
from omni_hf.distributed import ContextParallelMixin

LENGTH = 1024  # tokens per packed row of the CPU run

MODELS = {  # random weights of these sizes
    "tiny": dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16),
    "tinyllama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, head_dim=64),
}


def samples(count: int, vocab: int, seed: int = 0) -> list[dict]:
    """``count`` samples of 60-200 tokens, each with a 30-token image span (attended both ways)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        length = int(torch.randint(60, 201, (), generator=gen))
        start = int(torch.randint(5, length - 40, (), generator=gen))
        out.append({"input_ids": torch.randint(1, vocab, (length,), generator=gen).tolist(),
                    "modality_spans": [(start, start + 30)]})
    return out


def long_samples(count: int, vocab: int, size: int, seed: int = 0) -> list[dict]:
    """``count`` samples of ``size`` tokens, each with one image span of 64-576 tokens (a row of ``--batch`` of them
    is exactly ``--length`` tokens)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        image = min(int(torch.randint(64, 577, (), generator=gen)), size - 16)
        start = int(torch.randint(1, size - image, (), generator=gen))
        out.append({"input_ids": torch.randint(1, vocab, (size,), generator=gen).tolist(),
                    "modality_spans": [(start, start + image)]})
    return out


def build_model(name: str = "tiny", length: int = LENGTH, device: str = "cpu") -> torch.nn.Module:
    """The named model, the same random weights in every process: float32 on the CPU; on a GPU bf16, drawn there,
    with activation checkpointing."""
    torch.manual_seed(0)
    config = LlamaConfig(**MODELS[name], max_position_embeddings=max(length, 2048), use_cache=False)
    if device == "cpu":
        return AutoModelForCausalLM.from_config(config, attn_implementation="omni")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="omni", dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def tiny_llama() -> torch.nn.Module:
    return build_model()


class StepTimes(TrainerCallback):
    """Wall time of each optimizer step, the GPU synchronized at both ends."""

    def __init__(self):
        self.times: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)


class RecordLosses:
    """Keeps each micro-batch's loss as ``training_step`` returns it (this rank's share, unrounded)."""

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.losses = [*getattr(self, "losses", []), loss.detach().float().reshape(())]
        return loss


def trainer_class(name: str, cp: int):
    if name == "sft":
        from trl import SFTTrainer as base
    else:
        base = Trainer
    bases = (RecordLosses, ContextParallelMixin, base) if cp > 1 else (RecordLosses, base)
    return type(f"CP{base.__name__}" if cp > 1 else base.__name__, bases, {})


def tokenizer(vocab: int):
    """SFTTrainer wants a processing class: a word-level one over ``vocab`` ids (the samples are tokenized)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="t0")),
                                   pad_token="t0", eos_token="t1", unk_token="t0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, default=None, help="ranks sharing a row (default: all)")
    parser.add_argument("--trainer", default="trainer", choices=("trainer", "sft"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4, help="samples packed per row (per_device_train_batch_size)")
    parser.add_argument("--accumulation", type=int, default=1, help="gradient_accumulation_steps")
    parser.add_argument("--optim", default="adamw_torch", help="TrainingArguments.optim (sgd: the update is the "
                        "gradient, for comparing runs)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: one GPU per process")
    parser.add_argument("--model", default="tiny", choices=tuple(MODELS))
    parser.add_argument("--length", type=int, default=LENGTH, help="tokens per packed row")
    parser.add_argument("--warmup", type=int, default=0, help="first steps left out of the timing (cuda)")
    parser.add_argument("--json", type=Path, default=None, help="write the losses (and on a GPU the times) here")
    parser.add_argument("--baseline", type=Path, default=None, help="one process's --json: adds the speedup and "
                        "the losses' largest relative difference")
    parser.add_argument("--weights", type=Path, default=None, help="save the trained weights here (rank 0)")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    common = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch, max_steps=args.steps,
                  gradient_accumulation_steps=args.accumulation, learning_rate=args.lr, optim=args.optim,
                  lr_scheduler_type="constant", weight_decay=0.0, seed=0, report_to=[], save_strategy="no",
                  logging_steps=1, use_cpu=not cuda, dataloader_num_workers=0, ddp_find_unused_parameters=False,
                  remove_unused_columns=False)  # keep the samples' modality_spans
    model = build_model(args.model, args.length, "cuda" if cuda else "cpu")
    vocab = model.config.vocab_size
    collator = OmniCollator(pad_token_id=0, mode="pack", max_length=args.length, pad_to_multiple_of=64)
    world = int(os.environ.get("WORLD_SIZE", 1))
    cp = world if args.cp is None else args.cp
    count = args.steps * args.accumulation * args.batch * (world // cp)
    dataset = long_samples(count, vocab, args.length // args.batch) if cuda else samples(count, vocab)
    if args.trainer == "sft":
        from datasets import Dataset
        from trl import SFTConfig

        training_args = SFTConfig(**common, bf16=False, gradient_checkpointing=False,  # float32, as Trainer
                                  dataset_kwargs={"skip_prepare_dataset": True})
        extra = dict(processing_class=tokenizer(vocab))
        dataset = Dataset.from_list(dataset)
    else:
        training_args, extra = TrainingArguments(**common), {}
    cls = trainer_class(args.trainer, cp)
    kwargs = dict(model=model, args=training_args, train_dataset=dataset, data_collator=collator, **extra)
    trainer = cls(**kwargs, cp_size=cp) if cp > 1 else cls(**kwargs)
    timer = StepTimes() if cuda else None
    if timer:
        trainer.add_callback(timer)
    trainer.train()

    losses = torch.stack(trainer.losses)
    if dist.is_initialized():  # each rank's share: their mean is the loss Trainer logs
        dist.all_reduce(losses)
        losses /= dist.get_world_size()
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"{cls.__name__}: micro-batch losses {losses.tolist()}")
        record = {"engine": cls.__name__, "losses": losses.tolist(), "cp": cp, "world": world, "gpus": world if cuda
                  else 0, "model": args.model, "length": args.length}
        if timer:
            step_s = timer.times[args.warmup:]
            record.update(step_s=step_s, tokens_per_s=(world // cp) * args.accumulation * args.length
                          / statistics.median(step_s), peak_gib=torch.cuda.max_memory_allocated() / 2**30)
            print(f"{record['tokens_per_s']:.0f} tokens/s, steps {[round(t, 3) for t in step_s]} s, "
                  f"peak {record['peak_gib']:.1f} GiB")
        if args.baseline:
            base = json.loads(args.baseline.read_text())
            record["loss_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(record["losses"], base["losses"]))
            if timer:
                record["speedup"] = record["tokens_per_s"] / base["tokens_per_s"]
            print(f"against one process: speedup {record.get('speedup', float('nan')):.3f}x, "
                  f"loss_rel_diff {record['loss_rel_diff']:.2e}")
        if args.json:
            args.json.write_text(json.dumps(record) + "\n")
        if args.weights:
            torch.save({k: v.detach().cpu() for k, v in trainer.accelerator.unwrap_model(trainer.model)
                        .state_dict().items()}, args.weights)
    # The engine (DDP's reducer holds a handle on the process group) goes before the group: freed after it, at exit,
    # a gloo group's destructor can wait on threads whose peers have left.
    del trainer, model
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
