"""Tiny VLM families and processed samples of random text and images, as their Transformers processors return them,
for the SFT example's tests and the collator's processor tests. They run the example (examples/sft_vlm.py), so they
need its extra: a test module importing them is skipped without it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

for extra in ("datasets", "trl", "peft"):  # the example's extra (`sft`)
    pytest.importorskip(extra, reason=f"examples/sft_vlm.py needs {extra}: python3 -m pip install -e '.[sft]'")
from examples import sft_vlm  # noqa: E402

WORDS = ("the", "red", "cat", "sits", "on", "a", "blue", "mat", "why", "?", "yes", "no", "3", "image")
QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PLACEHOLDER = {"gemma3": "<start_of_image>", "idefics3": "<image>", "llava": "<image>"}


def random_text(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(1, 6))))


def random_image(rng: np.random.Generator) -> Image.Image:
    """Random RGB pixels, 12-40 a side."""
    height, width = (int(x) for x in rng.integers(12, 41, 2))
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def random_parts(rng: np.random.Generator) -> list[str | Image.Image]:
    """Text and 0-2 random images, interleaved, starting and ending with text."""
    parts: list[str | Image.Image] = [random_text(rng)]
    for _ in range(int(rng.integers(0, 3))):
        parts += [random_image(rng), random_text(rng)]
    return parts


def processed(processor, parts: list[str | Image.Image], placeholder: str) -> dict:
    """The processor's outputs for one sample: its text with ``placeholder`` where the images go."""
    images = [p for p in parts if isinstance(p, Image.Image)]
    text = "".join(placeholder if isinstance(p, Image.Image) else p for p in parts)
    out = processor(text=[text], images=[images] if images else None, return_tensors="pt", add_special_tokens=False)
    return dict(out)


def qwen2_vl_processed(tokenizer, image_processor, parts: list[str | Image.Image], image_id: int) -> dict:
    """What Qwen2VLProcessor returns for one sample (it needs torchvision for its video processor, so its two
    steps are run here): the image processor's ``pixel_values`` / ``image_grid_thw``, and each image written as
    ``<|vision_start|>`` + ``t*h*w/4`` ``<|image_pad|>`` + ``<|vision_end|>``."""
    images = [p for p in parts if isinstance(p, Image.Image)]
    vision = dict(image_processor(images=images, return_tensors="pt")) if images else {}
    counts = iter((vision["image_grid_thw"].prod(-1) // 4).tolist() if images else [])
    text = "".join(f"<|vision_start|>{'<|image_pad|>' * next(counts)}<|vision_end|>" if isinstance(p, Image.Image)
                   else p for p in parts)
    input_ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == image_id).long(), **vision}


def tiny_paligemma() -> tuple[transformers.PretrainedConfig, transformers.ProcessorMixin]:
    """PaliGemma: 16 tokens per image, the prefix (images and prompt) one bidirectional block, positions from 1."""
    tokenizer = sft_vlm.byte_tokenizer({"image_token": "<image>"})
    image_processor = transformers.SiglipImageProcessorPil(size={"height": 16, "width": 16})
    image_processor.image_seq_length = 16  # where PaliGemma's processor reads the image token count
    processor = transformers.PaliGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer)
    vision = transformers.SiglipVisionConfig(**sft_vlm.TINY_VISION, vision_use_head=False)
    text = transformers.GemmaConfig(vocab_size=len(tokenizer), **sft_vlm.TINY_LM)
    config = transformers.PaliGemmaConfig(vision_config=vision, text_config=text, vocab_size=len(tokenizer),
                                          image_token_index=processor.image_token_id, projection_dim=64, hidden_size=64)
    return config, processor


def paligemma_processed(processor, rng: np.random.Generator) -> dict:
    """One or two images, a prompt and a suffix (labels on the suffix only), as PaliGemma's processor returns them."""
    images = [random_image(rng) for _ in range(int(rng.integers(1, 3)))]
    out = processor(text=["<image>" * len(images) + random_text(rng)], images=[images], suffix=[random_text(rng)],
                    return_tensors="pt")
    return dict(out)


def tiny(arch: str, count: int, seed: int) -> tuple[transformers.PretrainedConfig, list[dict]]:
    """The tiny config of ``arch`` and ``count`` processed samples of random text and images."""
    rng = np.random.default_rng(seed)
    if arch == "paligemma":
        config, processor = tiny_paligemma()
        return config, [paligemma_processed(processor, rng) for _ in range(count)]
    if arch == "qwen2_vl":
        tokenizer = sft_vlm.byte_tokenizer(QWEN_TOKENS)
        config = sft_vlm.qwen2_vl_config(tokenizer)
        image_processor = transformers.Qwen2VLImageProcessorPil(min_pixels=16 * 16, max_pixels=32 * 32, patch_size=4,
                                                                temporal_patch_size=2, merge_size=2)
        return config, [qwen2_vl_processed(tokenizer, image_processor, random_parts(rng), config.image_token_id)
                        for _ in range(count)]
    config, processor = sft_vlm.TINY[arch]()
    return config, [processed(processor, random_parts(rng), PLACEHOLDER[arch]) for _ in range(count)]


def with_images(arch: str, count: int, seed: int) -> tuple[transformers.PretrainedConfig, list[dict]]:
    """`tiny` samples, redrawn (next seed) until at least two have images and one has none (PaliGemma's all have)."""
    while True:
        config, samples = tiny(arch, count, seed)
        has_images = ["pixel_values" in s for s in samples]
        if sum(has_images) >= 2 and (arch == "paligemma" or not all(has_images)):
            return config, samples
        seed += 1
