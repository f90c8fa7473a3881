"""Held-out evaluation: answer loss, exact-match accuracy of greedily decoded answers, blind baselines."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import torch
import torch.nn.functional as F

from omni_hf import OmniCollator
from omni_hf.integrations.transformers.other_backends import attention_kwargs

from .data import TASKS, SampleEncoder, SceneConfig
from .model import VLM
from .tokenizer import WordTokenizer

Sample = Mapping[str, Any]  # an encoded sample (`training.data.SampleEncoder`)


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross entropy (fp32) over labels != -100, and their count. ``logits`` ``[B, L, V]``,
    ``labels`` int64 ``[B, L]`` unshifted (position ``t`` predicts ``labels[t + 1]``)."""
    targets = labels[:, 1:]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100, reduction="sum")
    return loss, (targets != -100).sum()


class Evaluator:
    """Scores a `VLM` on encoded held-out samples (this process's share of them).

    Args:
        samples: encoded samples; ``prompt_length`` splits each into prompt and answer (+ ``<eos>``).
        tasks: the task name of each sample (one of ``TASKS``), for per-task accuracy.
        attn, mask: the backend and mask of the run (see `omni_hf.integrations.transformers.other_backends`).
        pad_token_id, eos_token_id: of the tokenizer.
        batch_size: samples per forward pass (padded, one per row).
    """

    def __init__(self, samples: Sequence[Sample], tasks: Sequence[str], attn: str, mask: str, pad_token_id: int,
                 eos_token_id: int, batch_size: int) -> None:
        self.samples, self.tasks = list(samples), list(tasks)
        self.attn, self.mask, self.eos = attn, mask, eos_token_id
        self.batch_size = batch_size
        self.collator = OmniCollator(pad_token_id, train_on_prompt=False)

    @torch.no_grad()
    def __call__(self, model: VLM, device: torch.device) -> dict[str, torch.Tensor]:
        """Sums over this process's samples, to reduce across processes and pass to `summarise`: ``loss``
        (NLL of the answer tokens, fp32), ``tokens``, and ``correct`` / ``count`` per task (int64
        ``[len(TASKS)]``)."""
        loss = torch.zeros((), device=device)
        tokens = torch.zeros((), device=device, dtype=torch.int64)
        correct = torch.zeros(len(TASKS), device=device, dtype=torch.int64)
        count = torch.zeros_like(correct)
        for start in range(0, len(self.samples), self.batch_size):
            samples = self.samples[start:start + self.batch_size]
            task = torch.tensor([TASKS.index(t) for t in self.tasks[start:start + self.batch_size]], device=device)
            logits, batch = self._forward(model, samples, device)
            batch_loss, batch_tokens = token_loss(logits, batch["labels"])
            loss, tokens = loss + batch_loss, tokens + batch_tokens
            right = torch.tensor(self._answers_right(model, samples, device), device=device)
            correct += torch.bincount(task[right], minlength=len(TASKS))
            count += torch.bincount(task, minlength=len(TASKS))
        return {"loss": loss, "tokens": tokens, "correct": correct, "count": count}

    def _forward(self, model: VLM, samples: Sequence[Sample], device: torch.device):
        """Logits ``[B, L, V]`` of the padded batch of ``samples``, and that batch (on ``device``)."""
        batch = {k: v.to(device) for k, v in self.collator(samples).items()}
        logits = model(batch["input_ids"], batch.get("pixel_values"), **attention_kwargs(batch, self.attn, self.mask))
        return logits, batch

    def _answers_right(self, model: VLM, samples: Sequence[Sample], device: torch.device) -> list[bool]:
        """Greedy decoding from each prompt until ``<eos>`` (at most the answer's length + 1 tokens);
        right when the decoded tokens equal the answer and ``<eos>``."""
        prompts = [dict(s, input_ids=list(s["input_ids"][:s["prompt_length"]])) for s in samples]
        answers = [list(s["input_ids"][s["prompt_length"]:]) for s in samples]
        decoded: list[list[int]] = [[] for _ in samples]
        for _ in range(max(map(len, answers))):
            live = [i for i, d in enumerate(decoded) if self.eos not in d]
            if not live:
                break
            batch = [dict(prompts[i], input_ids=prompts[i]["input_ids"] + decoded[i]) for i in live]
            logits, _ = self._forward(model, batch, device)
            last = torch.tensor([len(s["input_ids"]) - 1 for s in batch], device=device)
            for i, token in zip(live, logits[torch.arange(len(live), device=device), last].argmax(-1).tolist()):
                decoded[i].append(token)
        return [d == a for d, a in zip(decoded, answers)]


def held_out_evaluator(held_out: datasets.Dataset, tokenizer: WordTokenizer, scene: SceneConfig, attn: str, mask: str,
                       *, shard: tuple[int, int] = (0, 1), blank_images: bool = False) -> Evaluator:
    """An `Evaluator` of shard ``(index, count)`` of the held-out split (every ``count``-th sample), its images
    rendered now; ``blank_images`` renders every scene empty (the blind baseline of the same model)."""
    share = held_out.select(range(shard[0], len(held_out), shard[1]))
    encoded = share.with_transform(SampleEncoder(tokenizer, scene, blank_images))
    return Evaluator([encoded[i] for i in range(len(share))], share["task"], attn, mask, tokenizer.pad_id,
                     tokenizer.eos_id, batch_size=128)


def summarise(sums: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Loss per answer token, overall and per-task accuracy from `Evaluator` sums (reduced over processes)."""
    correct, count = sums["correct"].tolist(), sums["count"].tolist()
    return {"loss": float(sums["loss"] / sums["tokens"]), "accuracy": sum(correct) / sum(count),
            "task_accuracy": {t: c / n for t, c, n in zip(TASKS, correct, count) if n}}


def question_prior_accuracy(train: datasets.Dataset, held_out: datasets.Dataset) -> float:
    """Accuracy of the best blind guess: the train split's most frequent answer to the same question text
    (or to the same task, for a question never seen in training). No text-only model can beat this on
    average."""
    by_question: dict[str, Counter] = defaultdict(Counter)
    by_task: dict[str, Counter] = defaultdict(Counter)
    for question, task, answer in zip(train["question"], train["task"], train["answer"]):
        by_question[question][answer] += 1
        by_task[task][answer] += 1

    def guess(q: str, t: str) -> str:
        return (by_question.get(q) or by_task[t]).most_common(1)[0][0]

    hits = [guess(q, t) == a for q, t, a in zip(held_out["question"], held_out["task"], held_out["answer"])]
    return sum(hits) / len(hits)
