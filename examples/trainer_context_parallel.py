"""Packed rows split across ranks, trained by ``transformers.Trainer`` (or TRL's ``SFTTrainer``) with omni's context
parallelism: `omni_hf.distributed.ContextParallelMixin` in front of the trainer class.

    torchrun --nproc-per-node 2 examples/trainer_context_parallel.py                  # CPU (gloo), tiny Llama, cp=2
    torchrun --nproc-per-node 4 examples/trainer_context_parallel.py --cp 2           # 2 rows at a time, 2 ranks each
    torchrun --nproc-per-node 2 examples/trainer_context_parallel.py --trainer sft    # TRL's SFTTrainer
    python examples/trainer_context_parallel.py --cp 1                                # one process, whole rows

Synthetic samples (text with a bidirectional image span each) are packed by `OmniCollator`, four per rank of a row
and step. ``--json`` writes every micro-batch's loss (averaged over the ranks, as Trainer logs it) and ``--weights``
the trained weights (rank 0), for comparing with one process (tests/distributed/test_trainer_context_parallel.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

import omni_hf  # noqa: F401  (registers attn_implementation="omni")
from omni_hf import OmniCollator
from omni_hf.distributed import ContextParallelMixin

LENGTH = 1024  # tokens per packed row


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


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=LENGTH,
                         use_cache=False)
    return AutoModelForCausalLM.from_config(config, attn_implementation="omni")


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
    parser.add_argument("--json", type=Path, default=None, help="write the losses here (rank 0)")
    parser.add_argument("--weights", type=Path, default=None, help="save the trained weights here (rank 0)")
    args = parser.parse_args()

    common = dict(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=args.batch, max_steps=args.steps,
                  gradient_accumulation_steps=args.accumulation, learning_rate=args.lr, optim=args.optim,
                  lr_scheduler_type="constant", weight_decay=0.0, seed=0, report_to=[], save_strategy="no",
                  logging_steps=1, use_cpu=True, dataloader_num_workers=0, ddp_find_unused_parameters=False,
                  remove_unused_columns=False)  # keep the samples' modality_spans
    model = tiny_llama()
    vocab = model.config.vocab_size
    collator = OmniCollator(pad_token_id=0, mode="pack", max_length=LENGTH, pad_to_multiple_of=64)
    world = int(os.environ.get("WORLD_SIZE", 1))
    cp = world if args.cp is None else args.cp
    dataset = samples(args.steps * args.accumulation * args.batch * (world // cp), vocab)
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
    trainer.train()

    losses = torch.stack(trainer.losses)
    if dist.is_initialized():  # each rank's share: their mean is the loss Trainer logs
        dist.all_reduce(losses)
        losses /= dist.get_world_size()
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"{cls.__name__}: micro-batch losses {losses.tolist()}")
        if args.json:
            args.json.write_text(json.dumps({"losses": losses.tolist(), "cp": cp, "world": world}) + "\n")
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
