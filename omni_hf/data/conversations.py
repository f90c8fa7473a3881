"""TRL-style conversation samples (``messages`` or ``prompt`` / ``completion``, with ``images``) through a
Transformers processor, so `OmniCollator` takes raw samples as TRL's own VLM collator does."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["process_conversation"]


def process_conversation(processor: Any, sample: Mapping[str, Any], index: int) -> dict[str, Any]:
    """One TRL-style conversation sample through ``processor``: the processed sample for `OmniCollator`.

    ``sample``: ``messages`` (a list of ``{"role", "content"}``; the prompt is every message before a final
    assistant message) or ``prompt`` and ``completion`` (lists of messages), and ``images`` (a list of
    images, one per ``{"type": "image"}`` entry of the contents, in order) or ``image`` (one).

    Returns the processor's outputs for the one sample (``input_ids`` int64 ``[1, n]``, the model's vision
    inputs; ``attention_mask`` dropped) and ``prompt_length``, the tokens of the prompt rendered with the
    generation prompt (0 when there is no prompt). Raises a ValueError naming ``samples[index][key]`` when the
    sample has neither form, or when the chat template renders the prompt other than as a prefix of the whole.
    """
    where = f"samples[{index}]"
    if "messages" in sample:
        messages = list(sample["messages"])
        final_answer = len(messages) > 1 and messages[-1].get("role") == "assistant"
        prompt = messages[:-1] if final_answer else None
    elif "prompt" in sample and "completion" in sample:
        prompt, messages = list(sample["prompt"]), [*sample["prompt"], *sample["completion"]]
    else:
        raise ValueError(f"{where}: expected 'input_ids', 'messages', or 'prompt' and 'completion', got keys "
                         f"{sorted(sample)}")
    images = list(sample.get("images") or []) + ([sample["image"]] if sample.get("image") is not None else [])
    text = processor.apply_chat_template(messages, tokenize=False)
    out = processor(text=[text], images=[images] if images else None, return_tensors="pt", add_special_tokens=False)
    processed = {key: value for key, value in out.items() if key != "attention_mask"}
    processed["prompt_length"] = 0 if prompt is None else _prompt_length(processor, prompt, text, out, where)
    return processed


def _prompt_length(processor: Any, prompt: list, text: str, out: Mapping[str, torch.Tensor], where: str) -> int:
    """Tokens before the completion: the whole sample's length minus the completion's tokens, which must end it."""
    prompt_text = processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    if not text.startswith(prompt_text):
        raise ValueError(f"{where}['messages']: expected the chat template to render the prompt (with the generation "
                         f"prompt) as the start of the conversation, got {prompt_text[-40:]!r} against "
                         f"{text[:len(prompt_text)][-40:]!r}")
    completion = processor.tokenizer(text[len(prompt_text):], add_special_tokens=False)["input_ids"]
    input_ids = out["input_ids"][0].tolist()
    if completion and input_ids[-len(completion):] != completion:
        raise ValueError(f"{where}['messages']: expected the completion's tokens to end the sample's tokens (the "
                         f"tokenizer merges across the prompt's end), got {completion[:8]} against "
                         f"{input_ids[-len(completion):][:8]}")
    return len(input_ids) - len(completion)
