"""Train the small VLM on the synthetic shapes questions, with omni attention (or another backend).

    python -m training.train_vlm --preset tiny --output-dir runs/tiny                # CPU, under 2 minutes
    python -m training.train_vlm --preset small --attn omni --output-dir runs/small  # one GPU
    accelerate launch --num_processes 2 -m training.train_vlm --preset small ...     # two GPUs
    python -m training.train_vlm ... --resume runs/small/checkpoint-1000            # go on from a checkpoint

Writes ``metrics.json`` (train loss and tokens/s, held-out loss and accuracy, baselines), ``metrics.png``
and ``checkpoint-<step>/`` (``model/``: the VLM in safetensors and its tokenizer; ``state/``: optimizer,
scheduler and RNG state for ``--resume``) under ``--output-dir``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

import omni_hf  # noqa: F401  (registers attn_implementation="omni")
from omni_hf import OmniCollator
from omni_hf.integrations.transformers.other_backends import BACKENDS, MASKS, attention_kwargs

from .data import SampleEncoder, SceneConfig, make_split, make_tokenizer
from .evaluate import Evaluator, held_out_evaluator, question_prior_accuracy, summarise, token_loss
from .model import VLM, LMShape, VisionConfig, build_lm, load_lm
from .report import plot


@dataclasses.dataclass(frozen=True)
class Preset:
    """Everything a run's size depends on; command-line flags override the scalar fields."""

    scene: SceneConfig
    lm: LMShape
    max_length: int  # tokens per packed row
    batch_samples: int  # samples per micro-batch and process (packed into rows of max_length)
    grad_accum: int
    steps: int  # optimizer steps
    lr: float
    warmup: int
    train_samples: int
    eval_samples: int
    eval_every: int
    log_every: int
    save_every: int  # 0: only at the end


PRESETS = {
    "tiny": Preset(scene=SceneConfig(grid=3, cell=8, max_objects=3, max_images=2),
                   lm=LMShape(hidden=128, layers=2, heads=2, kv_heads=1, intermediate=256),
                   max_length=256, batch_samples=16, grad_accum=1, steps=40, lr=3e-3, warmup=4,
                   train_samples=2000, eval_samples=64, eval_every=20, log_every=1, save_every=0),
    "small": Preset(scene=SceneConfig(grid=4, cell=16, max_objects=5, max_images=3),
                    lm=LMShape(hidden=384, layers=6, heads=6, kv_heads=2, intermediate=1024),
                    max_length=2048, batch_samples=512, grad_accum=1, steps=2000, lr=1e-3, warmup=100,
                    train_samples=100_000, eval_samples=1000, eval_every=250, log_every=10, save_every=1000),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=PRESETS, default="small")
    parser.add_argument("--attn", choices=BACKENDS, default="omni", help="the LM's attn_implementation")
    parser.add_argument("--mask", choices=MASKS, default="interleaved",
                        help="interleaved: images bidirectional; causal: every token causal")
    parser.add_argument("--model", help="a local causal LM checkpoint instead of a random Llama of the preset")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--resume", type=Path, help="a checkpoint-<step> directory to go on from")
    parser.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"),
                        default="bf16" if torch.cuda.is_available() else "no")
    parser.add_argument("--num-workers", type=int,
                        default=min(12, (os.cpu_count() or 4) - 2) if torch.cuda.is_available() else 0,
                        help="DataLoader workers per process (they render the images)")
    parser.add_argument("--seed", type=int, default=0)
    for field in dataclasses.fields(Preset):
        if field.type in ("int", "float"):
            parser.add_argument(f"--{field.name.replace('_', '-')}", type={"int": int, "float": float}[field.type],
                                help=f"default: the preset's {field.name}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train, evaluate and checkpoint as the flags say; returns the metrics written to ``metrics.json``."""
    args = parse_args(argv)
    preset = dataclasses.replace(PRESETS[args.preset], **{f.name: getattr(args, f.name) for f in
                                                          dataclasses.fields(Preset) if getattr(args, f.name, None)
                                                          is not None})
    accelerator = Accelerator(mixed_precision=args.mixed_precision, gradient_accumulation_steps=preset.grad_accum,
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(args.seed)
    tokenizer = make_tokenizer()
    with accelerator.main_process_first():
        train, held_out = make_splits(preset, args.seed)

    lm = (load_lm(args.model, len(tokenizer), args.attn) if args.model else
          build_lm(preset.lm, len(tokenizer), preset.max_length, args.attn))
    model = VLM(lm, VisionConfig(preset.scene.image_size, preset.scene.cell, tokenizer.image_id))
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = transformers.get_cosine_schedule_with_warmup(optimizer, preset.warmup, preset.steps)
    collator = OmniCollator(tokenizer.pad_id, mode="pack", max_length=preset.max_length,
                            pad_to_multiple_of=preset.max_length, train_on_prompt=False)
    loader = DataLoader(train.with_transform(SampleEncoder(tokenizer, preset.scene)), batch_size=preset.batch_samples,
                        shuffle=True, drop_last=True, collate_fn=collator, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0, pin_memory=torch.cuda.is_available())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(scheduler)

    shard = (accelerator.process_index, accelerator.num_processes)
    evaluator = held_out_evaluator(held_out, tokenizer, preset.scene, args.attn, args.mask, shard=shard)
    metrics = {"config": _config(args, preset, accelerator), "train": [], "eval": []}
    step = 0
    if args.resume:
        accelerator.load_state(str(args.resume / "state"))
        state = json.loads((args.resume / "trainer_state.json").read_text())
        step, metrics["train"], metrics["eval"] = state["step"], state["train"], state["eval"]

    progress = tqdm(total=preset.steps, initial=step, disable=not accelerator.is_main_process, desc="train")
    batches = _micro_batches(accelerator, loader, done=step * preset.grad_accum)
    while step < preset.steps:
        interval = min(preset.log_every, preset.steps - step)
        started = time.perf_counter()
        loss, tokens, data_wait = _train_interval(accelerator, model, optimizer, scheduler, batches, args, interval)
        step += interval
        seconds = time.perf_counter() - started
        metrics["train"].append({"step": step, "loss": loss, "tokens_per_s": tokens / seconds, "seconds": seconds,
                                 "data_wait_seconds": data_wait, "lr": scheduler.get_last_lr()[0]})
        progress.update(interval)
        progress.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / seconds:,.0f}")
        if preset.eval_every and (step % preset.eval_every == 0 or step == preset.steps):
            metrics["eval"].append({"step": step, **_evaluate(evaluator, model, accelerator)})
            accelerator.print(_describe_eval(metrics["eval"][-1]))
        if step == preset.steps or (preset.save_every and step % preset.save_every == 0):
            _save(accelerator, model, tokenizer, args.output_dir / f"checkpoint-{step}", step, metrics)
    progress.close()

    if preset.eval_every:
        blank = held_out_evaluator(held_out, tokenizer, preset.scene, args.attn, args.mask, shard=shard,
                                   blank_images=True)
        metrics["baselines"] = {"blank_images": _evaluate(blank, model, accelerator)["accuracy"],
                                "question_prior": question_prior_accuracy(train, held_out)}
    metrics["summary"] = _summary(metrics)
    if accelerator.is_main_process:
        (args.output_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
        plot(metrics, args.output_dir / "metrics.png")
        print(json.dumps(metrics["summary"], indent=1))
    accelerator.end_training()
    return metrics


def make_splits(preset: Preset, seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The train and held-out splits of a run (disjoint random streams of the same generator)."""
    return (make_split(preset.scene, preset.train_samples, seed=2 * seed, num_proc=os.cpu_count()),
            make_split(preset.scene, preset.eval_samples, seed=2 * seed + 1))


def _micro_batches(accelerator: Accelerator, loader: DataLoader, done: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless micro-batches, reshuffled each epoch (seeded), starting after the first ``done``."""
    epoch, skip = divmod(done, len(loader))
    while True:
        loader.set_epoch(epoch)
        yield from accelerator.skip_first_batches(loader, skip) if skip else loader
        epoch, skip = epoch + 1, 0


def _train_interval(accelerator, model, optimizer, scheduler, batches, args, steps: int) -> tuple[float, int, float]:
    """``steps`` optimizer steps; returns the mean loss (over processes), the tokens seen (all processes,
    padding excluded) and the seconds this process waited for batches. The loss goes to the host once, at
    the end."""
    data_wait = 0.0
    loss_sum = torch.zeros((), device=accelerator.device)
    tokens = torch.zeros((), device=accelerator.device, dtype=torch.int64)
    micro_steps = 0
    while micro_steps < steps * accelerator.gradient_accumulation_steps:
        waiting = time.perf_counter()
        batch = next(batches)
        data_wait += time.perf_counter() - waiting
        with accelerator.accumulate(model):
            logits = model(batch["input_ids"], batch["pixel_values"], **attention_kwargs(batch, args.attn, args.mask))
            summed, count = token_loss(logits, batch["labels"])
            loss = summed / count
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach()
        tokens += (batch["omni_doc_ids"] >= 0).sum()
        micro_steps += 1
    mean_loss = accelerator.reduce(loss_sum / micro_steps, "mean").item()
    return mean_loss, int(accelerator.reduce(tokens, "sum").item()), data_wait


def _evaluate(evaluator: Evaluator, model, accelerator: Accelerator) -> dict[str, Any]:
    """Held-out metrics of ``model`` summed over all processes."""
    model.eval()
    with accelerator.autocast():
        sums = evaluator(accelerator.unwrap_model(model), accelerator.device)
    model.train()
    return summarise({key: accelerator.reduce(value, "sum") for key, value in sums.items()})


def _save(accelerator: Accelerator, model, tokenizer, directory: Path, step: int, metrics: dict[str, Any]) -> None:
    """``model/`` (VLM + tokenizer), ``state/`` (for ``--resume``) and ``trainer_state.json``."""
    accelerator.save_state(str(directory / "state"))
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(directory / "model")
        tokenizer.save(directory / "model" / "tokenizer.json")
        state = {"step": step, "train": metrics["train"], "eval": metrics["eval"]}
        (directory / "trainer_state.json").write_text(json.dumps(state))
    accelerator.wait_for_everyone()


def _describe_eval(record: dict[str, Any]) -> str:
    tasks = ", ".join(f"{task} {value:.2f}" for task, value in record["task_accuracy"].items())
    return f"step {record['step']}: held-out loss {record['loss']:.4f}, accuracy {record['accuracy']:.3f} ({tasks})"


def _summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """Final accuracy and loss, baselines, the median tokens/s and the share of time spent waiting for data,
    both past the first logged interval (warm-up)."""
    timed = metrics["train"][1:] or metrics["train"]
    rates = sorted(r["tokens_per_s"] for r in timed)
    summary = {"tokens_per_s": rates[len(rates) // 2], "steps": metrics["train"][-1]["step"],
               "train_seconds": sum(r["seconds"] for r in metrics["train"]),
               "data_wait_fraction": sum(r["data_wait_seconds"] for r in timed) / sum(r["seconds"] for r in timed)}
    if metrics["eval"]:
        summary |= {"accuracy": metrics["eval"][-1]["accuracy"], "eval_loss": metrics["eval"][-1]["loss"]}
    return summary | metrics.get("baselines", {})


def _config(args: argparse.Namespace, preset: Preset, accelerator: Accelerator) -> dict[str, Any]:
    """What the run was: flags, preset, processes, device and library versions."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return {"preset": args.preset, "attn": args.attn, "mask": args.mask, "model": args.model,
            "mixed_precision": args.mixed_precision, "processes": accelerator.num_processes, "seed": args.seed,
            **dataclasses.asdict(preset), "device": device, "torch": torch.__version__,
            "transformers": transformers.__version__}


if __name__ == "__main__":
    main()
