"""Packed VLM fine-tuning with TRL's SFTTrainer, omni attention and OmniCollator.

    python3 examples/sft_vlm.py                              # a tiny random Gemma3 on the CPU: seconds, no network
    python3 examples/sft_vlm.py --arch idefics3 --lora       # another tiny family, with a PEFT LoRA adapter
    python3 examples/sft_vlm.py --model PATH --dataset DIR   # a local checkpoint on a local dataset (GPU: bf16)

The dataset is in TRL's format for vision-language models: an ``images`` column (a list of images per row) and
a ``messages`` column (a conversation whose user turns hold ``{"type": "image"}`` entries where the images go).
By default a synthetic one: one to three coloured squares and "what colour is image two?". SFTTrainer hands
the raw rows to the collator, which runs the processor on each conversation, finds the image tokens, and packs
the samples into rows of ``--max-length`` tokens (TRL's own ``packing=True`` is for text datasets); omni
attends within each packed sample only, with the image blocks the model expects (bidirectional for Gemma3).

Tiny models (``--arch``) are built from configs written here, with a byte-level tokenizer and the family's own
image processor and processor classes (``qwen2_vl`` needs torchvision: its processor holds a video processor).
Needs ``python3 -m pip install -e ".[sft]"`` (trl, peft, datasets, pillow).
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from omni_hf import OmniCollator  # importing omni_hf registers attn_implementation="omni"

COLOURS = {"red": (220, 40, 40), "green": (40, 190, 70), "blue": (50, 90, 230), "yellow": (235, 215, 40)}
NUMBERS = ("one", "two", "three")
TINY_LM = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, max_position_embeddings=2048)
TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                   patch_size=4)


# ---------------------------------------------------------------------- data


def synthetic_dataset(size: int, seed: int, image_size: int = 16) -> datasets.Dataset:
    """``size`` rows in TRL's vision format: ``images`` (1-3 solid squares of ``image_size`` pixels, RGB) and
    ``messages`` (the user names the images and asks the colour of one of them; the assistant answers it)."""
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    rows = {"images": [], "messages": []}
    for _ in range(size):
        colours = [names[i] for i in rng.integers(0, len(names), int(rng.integers(1, 4)))]
        asked = int(rng.integers(0, len(colours)))
        content = []
        for number, colour in zip(NUMBERS, colours):
            content += [{"type": "text", "text": f"image {number}: "}, {"type": "image"}]
        content.append({"type": "text", "text": f" what colour is image {NUMBERS[asked]}?"})
        rows["images"].append([Image.new("RGB", (image_size, image_size), COLOURS[c]) for c in colours])
        rows["messages"].append([{"role": "user", "content": content},
                                 {"role": "assistant", "content": [{"type": "text", "text": colours[asked]}]}])
    return datasets.Dataset.from_dict(rows)


# ---------------------------------------------------------------------- tiny models


def byte_tokenizer(special_tokens: list[str] | dict[str, str]) -> transformers.PreTrainedTokenizerFast:
    """A byte-level tokenizer (one token per byte, no merges) with ``<pad>``, ``<bos>``, ``<eos>`` and
    ``special_tokens`` (a dict also sets the named attributes, e.g. ``image_token``)."""
    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<bos>",
                                                eos_token="<eos>", extra_special_tokens=special_tokens)


def special_token_ids(tokenizer: transformers.PreTrainedTokenizerBase) -> dict[str, int]:
    """``pad_token_id``, ``bos_token_id`` and ``eos_token_id`` of ``tokenizer``, for a tiny model's text config (so
    that the trainer finds the config agreeing with the tokenizer and has nothing to realign)."""
    return {name: getattr(tokenizer, name) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}


def chat_template(image: str) -> str:
    """``role: content`` lines, each image entry written as ``image`` (the processor's placeholder)."""
    return ("{% for m in messages %}{{ m['role'] }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
            "{% for c in m['content'] %}{% if c['type'] == 'image' %}" + image + "{% else %}{{ c['text'] }}"
            "{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: "
            "{% endif %}")


def tiny_gemma3() -> tuple[transformers.PretrainedConfig, transformers.ProcessorMixin]:
    """Gemma3: 4 tokens per image, bidirectional image blocks, sliding and full layers."""
    tokenizer = byte_tokenizer({"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                "eoi_token": "<end_of_image>"})
    processor = transformers.Gemma3Processor(
        image_processor=transformers.Gemma3ImageProcessorPil(size={"height": 16, "width": 16}), tokenizer=tokenizer,
        image_seq_length=4, chat_template=chat_template("<start_of_image>"))
    text = transformers.Gemma3TextConfig(vocab_size=len(tokenizer), sliding_window=16,
                                         layer_types=["sliding_attention", "full_attention"],
                                         **special_token_ids(tokenizer), **TINY_LM)
    config = transformers.Gemma3Config(text_config=text, vision_config=transformers.SiglipVisionConfig(**TINY_VISION),
                                       mm_tokens_per_image=4, image_token_index=tokenizer.image_token_id,
                                       boi_token_index=tokenizer.boi_token_id, eoi_token_index=tokenizer.eoi_token_id)
    return config, processor


def tiny_idefics3() -> tuple[transformers.PretrainedConfig, transformers.ProcessorMixin]:
    """Idefics3 (SmolVLM's architecture): each image split into 2 x 2 sub-images and a global one, 4 tokens each."""
    row_col = [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)]
    tokenizer = byte_tokenizer(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *row_col])
    processor = transformers.Idefics3Processor(
        image_processor=transformers.Idefics3ImageProcessorPil(size={"longest_edge": 32},
                                                               max_image_size={"longest_edge": 16}),
        tokenizer=tokenizer, image_seq_len=4, chat_template=chat_template("<image>"))
    text = transformers.LlamaConfig(vocab_size=len(tokenizer), **special_token_ids(tokenizer), **TINY_LM)
    config = transformers.Idefics3Config(vision_config=TINY_VISION, text_config=text, scale_factor=2,
                                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"))
    return config, processor


def tiny_llava() -> tuple[transformers.PretrainedConfig, transformers.ProcessorMixin]:
    """LLaVA: a CLIP tower, 16 patch tokens per image (the CLS token dropped)."""
    tokenizer = byte_tokenizer(["<image>"])
    processor = transformers.LlavaProcessor(
        image_processor=transformers.CLIPImageProcessorPil(size={"shortest_edge": 16},
                                                           crop_size={"height": 16, "width": 16}),
        tokenizer=tokenizer, patch_size=4, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=chat_template("<image>"))
    text = transformers.LlamaConfig(vocab_size=len(tokenizer), **special_token_ids(tokenizer), **TINY_LM)
    config = transformers.LlavaConfig(vision_config=transformers.CLIPVisionConfig(**TINY_VISION), text_config=text,
                                      image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_seq_length=16)
    return config, processor


def tiny_qwen2_vl() -> tuple[transformers.PretrainedConfig, transformers.ProcessorMixin]:
    """Qwen2-VL: images of 2 x 2 to 4 x 4 merged patches, 3-D rotary positions."""
    tokenizer = byte_tokenizer(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
    sizes = dict(patch_size=4, temporal_patch_size=2, merge_size=2)
    processor = transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessorPil(min_pixels=16 * 16, max_pixels=32 * 32, **sizes),
        video_processor=transformers.Qwen2VLVideoProcessor(**sizes), tokenizer=tokenizer,
        chat_template=chat_template("<|vision_start|><|image_pad|><|vision_end|>"))
    return qwen2_vl_config(tokenizer), processor


def qwen2_vl_config(tokenizer: transformers.PreTrainedTokenizerBase) -> transformers.PretrainedConfig:
    """The tiny Qwen2-VL config for ``tokenizer`` (``<|vision_start|>``, ``<|image_pad|>``, ... among its tokens)."""
    ids = tokenizer.convert_tokens_to_ids
    text = dict(vocab_size=len(tokenizer), **special_token_ids(tokenizer),
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                **TINY_LM)
    vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=4, spatial_merge_size=2,
                  temporal_patch_size=2)
    return transformers.Qwen2VLConfig(vision_config=vision, text_config=text, image_token_id=ids("<|image_pad|>"),
                                      video_token_id=ids("<|video_pad|>"),
                                      vision_start_token_id=ids("<|vision_start|>"),
                                      vision_end_token_id=ids("<|vision_end|>"))


TORCHVISION_MISSING = (
    "--arch qwen2_vl needs torchvision (Qwen2-VL's processor holds a video processor). Install the build that "
    "matches your torch: python3 -m pip install -e \".[vision]\" where torch came from PyPI, otherwise torchvision "
    "from the index your torch came from.")

TINY: dict[str, Callable[[], tuple[transformers.PretrainedConfig, transformers.ProcessorMixin]]] = {
    "gemma3": tiny_gemma3, "idefics3": tiny_idefics3, "llava": tiny_llava, "qwen2_vl": tiny_qwen2_vl}


# omni for the language model, where packed samples and image blocks are; sdpa for the vision tower, whose calls
# are one image each and whose head sizes (SigLIP 72, Qwen2-VL's ViT 80) omni's kernels do not take.
ATTENTION = {"text_config": "omni", "vision_config": "sdpa"}


def load(arch: str, model_path: str | None, seed: int) -> tuple[torch.nn.Module, transformers.ProcessorMixin]:
    """The model (`ATTENTION`; bf16 on a GPU) and its processor: from ``model_path``, or the tiny ``arch`` with
    random weights from ``seed``."""
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    if model_path is not None:
        processor = transformers.AutoProcessor.from_pretrained(model_path)
        model = transformers.AutoModelForImageTextToText.from_pretrained(model_path, attn_implementation=ATTENTION,
                                                                          dtype=dtype)
        return model, processor
    config, processor = TINY[arch]()
    torch.manual_seed(seed)
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation=ATTENTION, dtype=dtype)
    return model, processor


# ---------------------------------------------------------------------- training


def train(model: torch.nn.Module, processor: transformers.ProcessorMixin, dataset: datasets.Dataset, output_dir: str,
          *, steps: int, batch_samples: int, max_length: int, lr: float, lora: bool, seed: int) -> list[float]:
    """``steps`` SFTTrainer steps of ``batch_samples`` conversations each, packed into rows of ``max_length``
    tokens; returns the training loss of every step. ``lora``: train a PEFT LoRA adapter on the attention
    projections instead of the whole model."""
    from trl import SFTConfig, SFTTrainer  # the optional `sft` extra

    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    collator = OmniCollator.from_processor(processor, mode="pack", max_length=max_length, train_on_prompt=False)
    args = SFTConfig(output_dir=output_dir, max_steps=steps, per_device_train_batch_size=batch_samples,
                     learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, logging_steps=1,
                     save_strategy="no", report_to=[], seed=seed, **checkpointing_args(True),
                     bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available())
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=processor,
                         data_collator=collator, peft_config=peft_config)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def checkpointing_args(enabled: bool) -> dict[str, bool]:
    """The training arguments' activation checkpointing switch under the name the installed Transformers gives it
    (``activation_checkpointing``; releases without it know only ``gradient_checkpointing``, which later ones
    deprecate). TRL's configs turn it on unless told."""
    fields = transformers.TrainingArguments.__dataclass_fields__
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": enabled}


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(TINY), default="gemma3", help="tiny random model (no --model)")
    parser.add_argument("--model", help="a local checkpoint directory (any family OmniCollator.from_processor knows)")
    parser.add_argument("--dataset", help="a local dataset in TRL's vision format (datasets.load_from_disk "
                                          "directory); default: the synthetic colours")
    parser.add_argument("--samples", type=int, default=64, help="synthetic conversations")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-samples", type=int, default=8, help="conversations per step, packed into rows")
    parser.add_argument("--max-length", type=int, default=512, help="tokens per packed row")
    parser.add_argument("--lr", type=float, default=None, help="default: 3e-3 tiny, 2e-5 --model; with --lora "
                                                                 "1e-2 tiny, 2e-4 --model")
    parser.add_argument("--lora", action="store_true", help="train a PEFT LoRA adapter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="runs/sft_vlm")
    args = parser.parse_args(argv)
    if args.model is None and args.arch == "qwen2_vl" and importlib.util.find_spec("torchvision") is None:
        parser.error(TORCHVISION_MISSING)

    model, processor = load(args.arch, args.model, args.seed)
    dataset = (datasets.load_from_disk(args.dataset) if args.dataset
               else synthetic_dataset(args.samples, args.seed, image_size=16 if args.model is None else 224))
    default_lr = {(False, False): 3e-3, (False, True): 1e-2, (True, False): 2e-5, (True, True): 2e-4}
    lr = args.lr if args.lr is not None else default_lr[args.model is not None, args.lora]
    losses = train(model, processor, dataset, str(Path(args.output_dir)), steps=args.steps,
                   batch_samples=args.batch_samples, max_length=args.max_length, lr=lr, lora=args.lora,
                   seed=args.seed)
    print("loss per step:", " ".join(f"{loss:.3f}" for loss in losses))
    return losses


if __name__ == "__main__":
    main()
