"""A VLM training step at real size on packed rows of text and images: omni vs flex_attention vs sdpa (vs eager).

    python -m benchmarks.bench_vlm_training                          # speed at 8k and 16k, then the 50-step curves
    python -m benchmarks.bench_vlm_training --find-max-length --steps 0 --curve-steps 0   # longest row per backend
    python -m benchmarks.bench_vlm_training --archs gemma3-4b-hd128 --lengths 16384 --loss-chunk 4096 --steps 5
    python -m benchmarks.bench_vlm_training --archs gemma4 --pixels --lengths 4096 16384 --loss-chunk 4096 \
        --attn omni sdpa eager flex_attention --steps 3 --warmup 2 --curve-steps 0   # Gemma 4 from pixels
    python -m benchmarks.bench_vlm_training --tiny                   # tiny configs on the CPU (the CI check)

Architectures (random init, bf16; configs written out below with the released models' sizes): ``qwen2.5-vl-3b``
(Qwen2.5-VL-3B: 36 layers of 2048, 16 query / 2 KV heads of 128, vocab 151936; ViT of 32 layers of 1280),
``gemma3-4b`` (Gemma3-4B: 34 layers of 2560, 8 query / 4 KV heads of 256, sliding window 1024 on five layers in
six, vocab 262208; SigLIP-so400m at 896 px, 256 tokens per image), ``gemma3-4b-hd128`` (the same with 16 query /
8 KV heads of 128: the same projections and attention FLOPs, in the head size omni's kernels take; omni runs
``gemma3-4b`` only if its kernels take head dim 256, else the row says why not) and ``gemma4`` (Transformers'
``Gemma4TextConfig`` defaults: 30 layers of 2304, 8 query / 4 KV heads, sliding layers (window 512, five in six) at
head dim 256 and global layers at head dim 512, vocab 262144 with per-layer embeddings; images bidirectional in the
sliding layers; Gemma 4's vision tower at 12 layers of 768, images of 768 px, 256 tokens each; no audio tower).
A backend that cannot run a case (omni or Flex at head dim 512, say) gets the error in its row.

A row is one packed sequence of exactly ``length`` tokens (no padding, so Transformers detects the packing from the
positions): synthetic conversations (a prompt, one to three images, an answer; text drawn from a Zipf law over 900
token ids) packed by `OmniCollator` until the row is full (the last sample is text cut to fit).
Qwen2.5-VL images have 16-32 x 16-32 merged patches (256-1024 tokens), Gemma3 and Gemma 4 images 256 tokens. The
model's own image attention: causal for Qwen2.5-VL, bidirectional blocks for Gemma3 (``token_type_ids``) in every
layer, for Gemma 4 (``mm_token_type_ids``) in its sliding layers only.

By default the vision tower (sdpa for every backend) runs once per row, outside the timed step, and the step trains
the language model on the embeddings it hands over (captured at the language model's input): the towers are the
same work under every backend and would otherwise dominate the step (a 16k row holds about 40 Gemma3 images of
896 px, or 23 Qwen2.5-VL images of 2300 patches on average); Gemma 4's per-layer token embeddings are made there
too, so they get no gradient. With ``--pixels`` the step starts from the pixels, as a
user's does: the frozen tower runs forward in every step on the backend under test (``omni`` and the
``no_attention`` baseline; ``sdpa`` for the sdpa, eager and flex rows, as a Flex user keeps it: Transformers' flex
path compiles per image shape; ``--vision-attn sdpa`` puts every row's tower on sdpa), recorded per row as
``vision_attn``. The timed step: forward, backward (activation
checkpointing, non-reentrant) and AdamW of the language model and LM head, with each backend's mask made per step
as a user gets it:

- ``omni``: the collator's ``omni_doc_ids`` / ``omni_group_ids``; the mask is built in the forward (on the GPU).
- ``flex_attention`` (Transformers does not mark Qwen2.5-VL's text model flex-capable; its rows set the flag and say
  ``flex_forced``): a ``BlockMask`` per layer type from the same ids (the token rule, and for Gemma3's sliding
  layers also ``q - k < 1024``) by ``torch.compile(create_block_mask)``, handed over as Transformers takes prepared
  masks (``attention_mask={"full_attention": ..., "sliding_attention": ...}``). Transformers' own flex path builds
  the same masks from the positions and ``token_type_ids`` (its packing detection and Gemma3's image blocks compose
  with ``or_masks`` / ``and_masks``), so a user may also pass nothing; the prebuilt masks keep the build visible.
- ``sdpa`` and ``eager``: Transformers' dense ``[B, 1, L, L]`` mask, made from the restarting positions and
  ``token_type_ids``.
- Gemma 4 (`PREPARED_MASKS`): every backend gets a mask per layer type made per step from the collator's ids
  (`layer_rules`: the global layers causal, the sliding ones with the image blocks and ``q - k < 512``), handed over
  as Flex's are: omni an `OmniBlockMask` per type (the masks its ids give), sdpa and eager
  dense ones (Transformers 5.2x misplaces the image blocks of packed rows in the sliding layers). These are the masks
  Transformers makes for each sample alone (`tests/benchmarks/test_bench_vlm_training.py`).
- ``no_attention``: a baseline, not a backend: attention's output is its query, so the step times everything else;
  with it in a run, the table gives each backend's attention time (its step minus the baseline's) and share.

``--loss-chunk N`` computes the LM head and loss N positions at a time, recomputed in the backward
(`chunked_lm_loss`): the same loss without a row's fp32 logits at once, which a 16k Gemma3 row needs to fit in 80 GB.

Transformers 5.17 builds these masks right; 5.23 remaps packed positions inside the mask functions of Gemma3's
sliding layers and misplaces the image blocks there (its sdpa and own-flex masks, not the prebuilt ones; the cost
is the same, the loss is not: hence the curve on Qwen2.5-VL by default).

Parts: speed (``--steps`` timed steps after ``--warmup``: tokens/s, peak memory, and every step's loss: the same
weights and row under every backend, so the table gives each backend's largest loss gap to omni), the longest row
that fits (``--find-max-length``: lengths doubling from ``--max-length-start`` until a step runs out of memory, then
bisection to ``--max-length-resolution``; at most ``--max-length-cap``) and a ``--curve-steps`` run of each backend
of ``--curve-attn`` (default omni and sdpa) from the same seed on new rows each step (the first arch, the shortest
length), whose losses must agree with the first backend's within bf16 noise. A short table is printed last; the
JSON (``vlm_training_<archs>_<lengths>_<backends>_<parts>.json``, so that parts run separately keep their own) goes
to ``--out`` (default ``$OUT``, else benchmarks/results/), rewritten after every part.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.utils.checkpoint
import transformers
from torch.nn.attention.flex_attention import and_masks, create_block_mask

from omni_hf import OmniBlockMask, OmniCollator, VisionInputs  # importing omni_hf registers "omni"
from omni_hf.mask import token_mask_mod as token_rule

RESULTS = Path(__file__).resolve().parent / "results"
BACKENDS = ("omni", "flex_attention", "sdpa", "eager")
DEFAULT_BACKENDS = ("omni", "flex_attention", "sdpa")
BASELINE = "no_attention"  # a step without attention (`no_attention`), timed when --attn names it
GIB = 1 << 30


# ---------------------------------------------------------------------- architectures


def qwen2_5_vl(tiny: bool) -> transformers.PretrainedConfig:
    """Qwen2.5-VL-3B (tiny: 2 layers of 64, a 1-layer ViT of 32, vocab 2048)."""
    if tiny:
        text = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                      window_size=16, fullatt_block_indexes=[0])
        mrope, ids = [2, 3, 3], dict(image_token_id=2047, video_token_id=2046, vision_start_token_id=2045,
                                    vision_end_token_id=2044)
    else:
        text = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                    num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=128000, rms_norm_eps=1e-6)
        vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                      patch_size=14, window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
        mrope, ids = [16, 24, 24], dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                                       vision_end_token_id=151653)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": mrope}
    vision |= dict(spatial_merge_size=2, temporal_patch_size=2, hidden_act="silu")
    return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)


def gemma3(tiny: bool, head_dim: int = 256) -> transformers.PretrainedConfig:
    """Gemma3-4B with heads of ``head_dim`` (256 as released; 128: twice the heads, the same widths) (tiny: 2
    layers of 64, sliding window 64, a 1-layer SigLIP of 32 at 16 px, 16 tokens per image, vocab 2048)."""
    if tiny:
        heads = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        text = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2, sliding_window=64,
                    layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096, **heads)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=16,
                      patch_size=4)
        ids, tokens = dict(image_token_index=2047, boi_token_index=2045, eoi_token_index=2046), 16
    else:
        heads = dict(num_attention_heads=8 * 256 // head_dim, num_key_value_heads=4 * 256 // head_dim,
                     head_dim=head_dim)
        text = dict(vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                    sliding_window=1024, max_position_embeddings=131072, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
                    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
                    **heads)
        vision = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                      image_size=896, patch_size=14)
        ids, tokens = dict(image_token_index=262144, boi_token_index=255999, eoi_token_index=256000), 256
    return transformers.Gemma3Config(text_config=transformers.Gemma3TextConfig(pad_token_id=0, **text),
                                     vision_config=transformers.SiglipVisionConfig(vision_use_head=False, **vision),
                                     mm_tokens_per_image=tokens, **ids)


def gemma4(tiny: bool) -> transformers.PretrainedConfig:
    """Gemma 4 at the defaults of Transformers' ``Gemma4TextConfig`` (30 layers of 2304, MLP 9216, 8 query / 4 KV
    heads; sliding layers (five in six, window 512) at head dim 256, global layers at head dim 512; vocab 262144 and
    per-layer embeddings of 256), images bidirectional in the sliding layers (``use_bidirectional_attention="vision"``),
    with Gemma 4's vision tower (``Gemma4VisionConfig``'s defaults: 768 wide, 12 heads of 64, patches of 16 px pooled
    3 x 3) at 12 layers; no audio tower (tiny: 3 layers of 64, global, sliding, global (a global layer before another
    layer, where its causal image rows count), heads of 16 and global heads of 32, window 32, a 1-layer tower of 32
    with patches of 4 px pooled 2 x 2, vocab 2048). Images are ``Sizes.patch_side`` patches a side."""
    if tiny:
        text = transformers.Gemma4TextConfig(
            vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=32, max_position_embeddings=4096,
            layer_types=["full_attention", "sliding_attention", "full_attention"], hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=2048, use_bidirectional_attention="vision")
        vision = transformers.Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                                 patch_size=4, pooling_kernel_size=2, position_embedding_size=64)
        ids = dict(image_token_id=2047, boi_token_id=2045, eoi_token_id=2046, video_token_id=2044,  # in the vocab: a
                   audio_token_id=2043, boa_token_id=2042, eoa_token_index=2041)  # forward from embeddings looks up all
    else:
        text = transformers.Gemma4TextConfig(use_bidirectional_attention="vision")
        vision = transformers.Gemma4VisionConfig(num_hidden_layers=12)
        ids = {}
    return transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None, **ids)


ARCHS: dict[str, Callable[[bool], transformers.PretrainedConfig]] = {
    "qwen2.5-vl-3b": qwen2_5_vl,
    "gemma3-4b-hd128": lambda tiny: gemma3(tiny, head_dim=128),
    "gemma3-4b": gemma3,
    "gemma4": gemma4,
}
DEFAULT_ARCHS = ("qwen2.5-vl-3b", "gemma3-4b-hd128")


# ---------------------------------------------------------------------- synthetic rows


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Token counts of the synthetic conversations (ranges inclusive)."""

    prompt: tuple[int, int]
    between: tuple[int, int]  # text after each image
    answer: tuple[int, int]
    merged_side: tuple[int, int]  # Qwen2.5-VL: merged patches per image side
    patch_side: int  # Gemma 4: patches per image side, a multiple of the pooling kernel


# Gemma 4's images: 768 px, 48 x 48 patches of 16 px, 256 tokens after pooling (its processor's default budget is 280)
REAL = Sizes(prompt=(32, 256), between=(4, 16), answer=(16, 128), merged_side=(16, 32), patch_side=48)
TINY = Sizes(prompt=(4, 24), between=(2, 6), answer=(4, 16), merged_side=(2, 5), patch_side=8)


def text_tokens(rng: np.random.Generator, count: int) -> np.ndarray:
    """int64 ``[count]`` ids in [100, 1000): ranks of a Zipf law (s = 1.2), so the loss has something to learn."""
    return 100 + (rng.zipf(1.2, count) - 1) % 900


def image_tokens(config, rng: np.random.Generator, sizes: Sizes, dtype: torch.dtype) -> tuple[np.ndarray, dict]:
    """One image: its tokens (with the family's markers) and its vision inputs, random pixels."""
    if config.model_type == "gemma3":
        vision = config.vision_config
        run = np.full(config.mm_tokens_per_image, config.image_token_id)
        tokens = np.concatenate([[config.boi_token_id], run, [config.eoi_token_id]])
        return tokens, {"pixel_values": torch.randn(1, 3, vision.image_size, vision.image_size, dtype=dtype)}
    if config.model_type == "gemma4":
        return _gemma4_image(config, sizes.patch_side, dtype)
    vision = config.vision_config
    height, width = (int(x) for x in rng.integers(sizes.merged_side[0], sizes.merged_side[1] + 1, 2))
    merge = vision.spatial_merge_size
    grid = torch.tensor([[1, height * merge, width * merge]])
    features = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    run = np.full(height * width, config.image_token_id)
    tokens = np.concatenate([[config.vision_start_token_id], run, [config.vision_end_token_id]])
    return tokens, {"pixel_values": torch.randn(int(grid.prod()), features, dtype=dtype), "image_grid_thw": grid}


def _gemma4_image(config, side: int, dtype: torch.dtype) -> tuple[np.ndarray, dict]:
    """A Gemma 4 image of ``side`` x ``side`` patches: its tokens (``(side / pooling)**2`` between the begin and end
    markers), random patches ``[1, side**2, 3 * patch**2]`` and their (x, y) positions ``[1, side**2, 2]``."""
    vision = config.vision_config
    run = np.full(gemma4_image_tokens(config, side), config.image_token_id)
    tokens = np.concatenate([[config.boi_token_id], run, [config.eoi_token_id]])
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.stack([xs.flatten(), ys.flatten()], -1)[None]
    patches = torch.randn(1, side * side, 3 * vision.patch_size ** 2, dtype=dtype)
    return tokens, {"pixel_values": patches, "image_position_ids": positions}


def gemma4_image_tokens(config, side: int) -> int:
    """The tokens of a Gemma 4 image of ``side`` x ``side`` patches; at most the sliding window, so that the window
    never cuts an image (then its sliding layers' rule is omni's token rule with the window)."""
    pool = config.vision_config.pooling_kernel_size
    tokens = (side // pool) ** 2
    assert side % pool == 0 and tokens <= config.text_config.sliding_window, (side, pool, tokens)
    return tokens


def conversation(config, rng: np.random.Generator, sizes: Sizes, dtype: torch.dtype) -> dict:
    """A processed sample: prompt, one to three images each followed by a little text, answer."""
    pieces, vision = [text_tokens(rng, int(rng.integers(*sizes.prompt, endpoint=True)))], []
    for _ in range(int(rng.integers(1, 4))):
        tokens, inputs = image_tokens(config, rng, sizes, dtype)
        pieces += [tokens, text_tokens(rng, int(rng.integers(*sizes.between, endpoint=True)))]
        vision.append(inputs)
    pieces.append(text_tokens(rng, int(rng.integers(*sizes.answer, endpoint=True))))
    sample = {"input_ids": np.concatenate(pieces)}
    for key in vision[0]:
        sample[key] = torch.cat([inputs[key] for inputs in vision])
    return _with_token_types(config, sample)


def _with_token_types(config, sample: dict) -> dict:
    """The per-token types the family's processor returns (image tokens 1)."""
    key = "token_type_ids" if config.model_type == "gemma3" else "mm_token_type_ids"
    return sample | {key: (sample["input_ids"] == config.image_token_id).astype(np.int64)}


def packed_row(config, length: int, seed: int, sizes: Sizes, dtype: torch.dtype) -> tuple[dict, dict]:
    """One packed row of exactly ``length`` tokens from ``seed``: the collator's batch (``[1, length]``) and its
    sample and image counts."""
    rng = np.random.default_rng(seed)
    samples, room = [], length
    while room > 0:
        sample = conversation(config, rng, sizes, dtype)
        if len(sample["input_ids"]) > room:  # the row's last sample: text cut to fit
            sample = _with_token_types(config, {"input_ids": text_tokens(rng, room)})
        samples.append(sample)
        room -= len(sample["input_ids"])
    collator = packing_collator(config, length, sizes)
    batch = collator(samples)
    assert batch["input_ids"].shape == (1, length) and "attention_mask" not in batch  # one full row
    count = collator.vision.count_key
    return batch, {"samples": len(samples), "images": sum(len(s[count]) for s in samples if count in s)}


def packing_collator(config, length: int, sizes: Sizes) -> OmniCollator:
    """The collator packing rows of ``length`` for the arch: `OmniCollator.from_config`, and for Gemma 4 (no family
    of the collator's) its settings written out: images as runs of the image token, each its own group, with
    ``mm_token_type_ids`` and the pixels and patch positions packed along dim 0."""
    settings = dict(mode="pack", max_length=length, pad_token_id=0)
    if config.model_type != "gemma4":
        return OmniCollator.from_config(config, **settings)
    vision = VisionInputs(image_token_ids=(config.image_token_id,),
                          tokens_per_image=gemma4_image_tokens(config, sizes.patch_side),
                          image_attention="bidirectional", token_keys=("mm_token_type_ids",),
                          image_keys={"pixel_values": 0, "image_position_ids": 0}, count_key="pixel_values")
    return OmniCollator(vision=vision, **settings)


# ---------------------------------------------------------------------- model and step


# Text models Transformers does not mark flex-capable (``_supports_flex_attn``), although their attention goes through
# the attention interface like any other's; the flex rows set the flag on them (recorded as ``flex_forced``).
FLEX_UNMARKED = {"qwen2_5_vl": "Qwen2_5_VLTextModel"}


def vision_attention(attn: str, args) -> str:
    """The vision tower's attention in a row of ``attn``: the backend's own where the step runs the tower
    (``args.pixels``), the backend is omni or the baseline and ``args.vision_attn`` is ``"backend"``, else sdpa."""
    own = args.pixels and args.vision_attn == "backend" and attn in ("omni", BASELINE)
    return attn if own else "sdpa"


def build_model(arch: str, attn: str, tiny: bool, seed: int, device: torch.device, dtype: torch.dtype,
                vision_attn: str = "sdpa"):
    """The arch with random weights from ``seed`` (the same for every backend), its language model on ``attn``
    and its vision tower on ``vision_attn``; the vision tower and projector frozen; activation checkpointing on."""
    config = ARCHS[arch](tiny)
    if attn == "flex_attention" and config.model_type in FLEX_UNMARKED:
        getattr(transformers, FLEX_UNMARKED[config.model_type])._supports_flex_attn = True
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForImageTextToText.from_config(
            config, attn_implementation={"text_config": attn, "vision_config": vision_attn}, dtype=dtype)
    language = model.model.language_model
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parameter in [*language.parameters(), *model.lm_head.parameters()]:
        parameter.requires_grad_(True)
    checkpointing = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    checkpointing({"use_reentrant": False})  # gradient_checkpointing_enable before its rename in Transformers 5.2x
    # Enabling checkpointing hooks every input embedding (the frozen vision tower's patch embedding too) to make its
    # output require grad, as reentrant checkpoints and adapters need: the frozen tower would then run its backward
    # in every step. Non-reentrant checkpoints need no such hook.
    model.disable_input_require_grads()
    return model.train()


# What the model takes of a collated row to start from its pixels.
PIXEL_INPUTS = ("input_ids", "pixel_values", "image_grid_thw", "image_position_ids", "token_type_ids",
                "mm_token_type_ids", "position_ids")
# Model types whose rows hand every backend its masks prepared per layer type from the collator's ids: Gemma 4 keeps
# image blocks in its sliding layers only (the collator's ids give omni one rule for every layer), and Transformers
# 5.2x remaps packed positions inside the mask functions of its sliding layers, misplacing the image blocks.
PREPARED_MASKS = ("gemma4",)


class _Captured(Exception):
    """Stops a forward once the language model's inputs are known."""


def language_model_inputs(model, batch: dict) -> dict:
    """``inputs_embeds`` ``[1, L, hidden]`` the model hands its language model for ``batch`` (the token embeddings
    with the vision tower's features merged in by the model's own code; one no-grad forward, stopped there), and
    Gemma 4's ``per_layer_inputs`` ``[1, L, layers, 256]`` (its per-layer token embeddings, which it cannot recover
    from ``inputs_embeds`` at this vocabulary)."""
    captured = {}

    def capture(module, args, kwargs):
        captured.update((key, kwargs[key]) for key in ("inputs_embeds", "per_layer_inputs")
                        if kwargs.get(key) is not None)
        raise _Captured

    handle = model.model.language_model.register_forward_pre_hook(capture, with_kwargs=True)
    skip_masks = {"attention_mask": {}} if model.config.model_type in PREPARED_MASKS else {}  # unused: stopped first
    try:
        with torch.no_grad():
            model(**{key: batch[key] for key in PIXEL_INPUTS if key in batch}, use_cache=False, **skip_masks)
    except _Captured:
        pass
    finally:
        handle.remove()
    return captured


def step_inputs(model, batch: dict, attn: str, device: torch.device, pixels: bool = False) -> Callable[[], dict]:
    """A function making one step's model inputs on ``device`` (the masks built in it, per step): the row's
    pixels with ``pixels``, else the language model's inputs made once by the tower."""
    config = model.config
    if pixels:
        common = {key: batch[key].to(device) for key in PIXEL_INPUTS if key in batch}
    else:
        common = language_model_inputs(model, {key: value.to(device) for key, value in batch.items()})
        common["position_ids"] = batch["position_ids"].to(device)
        if config.model_type == "gemma3":
            common["token_type_ids"] = batch["token_type_ids"].to(device)
    common |= {"labels": batch["labels"].to(device), "use_cache": False}
    doc, group = batch["omni_doc_ids"].to(device), batch["omni_group_ids"].to(device)
    if attn == BASELINE:
        return lambda: common
    rules = layer_rules(config)
    if config.model_type in PREPARED_MASKS:
        masks = prepared_masks(attn, doc, group, rules, model.dtype)
        return lambda: common | {"attention_mask": masks()}
    if attn == "omni":
        return lambda: common | {"omni_doc_ids": doc, "omni_group_ids": group}
    if attn == "flex_attention":
        mods = mask_mods(doc, group, rules)
        return lambda: common | {"attention_mask": flex_block_masks(mods, doc)}
    return lambda: common


def layer_rules(config) -> dict[str, tuple[bool, int | None]]:
    """Each layer type of the language model: whether its image groups attend bidirectionally, and its window (None:
    none). Gemma 3 has image blocks in every layer, Gemma 4 in its sliding layers only (its global ones are causal)."""
    text = config.get_text_config()
    return {layer_type: (layer_type == "sliding_attention" or config.model_type != "gemma4",
                         text.sliding_window if layer_type == "sliding_attention" else None)
            for layer_type in dict.fromkeys(text.layer_types)}


def mask_mods(doc: torch.Tensor, group: torch.Tensor, rules: dict[str, tuple[bool, int | None]]) -> dict:
    """A FlexAttention ``mask_mod`` per layer type of `layer_rules` over the ids (int ``[B, L]``): the token rule
    (with the image groups where the type has them), and with a window also ``q - k < window`` (as the models' own
    masks: the window cuts image pairs too)."""
    mods = {}
    for layer_type, (images, window) in rules.items():
        rule = token_rule(doc, group if images else None)
        mods[layer_type] = rule if window is None else and_masks(rule, lambda b, h, q, k, w=window: q - k < w)
    return mods


@functools.cache
def _compiled_create_block_mask() -> Callable:
    return torch.compile(create_block_mask)


def flex_block_masks(mods: dict, doc: torch.Tensor) -> dict:
    """A ``BlockMask`` per layer type from `mask_mods` over the ids ``doc`` (int ``[B, L]``), made by
    ``torch.compile(create_block_mask)`` on a GPU, as Flex's docs advise."""
    build = _compiled_create_block_mask() if doc.is_cuda else create_block_mask
    shape = (doc.shape[0], None, doc.shape[1], doc.shape[1])
    return {layer_type: build(mod, *shape, device=doc.device) for layer_type, mod in mods.items()}


def dense_mask(mod: Callable, length: int, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``mod`` (a ``mask_mod`` of one row) on every pair: bool ``[1, 1, L, L]`` (True: attend), or with ``dtype``
    additive (0 where allowed, the dtype's minimum elsewhere) as eager adds it to the scores."""
    positions = torch.arange(length, device=device, dtype=torch.int32)
    allowed = mod(torch.zeros((), dtype=torch.int32, device=device), None, positions[:, None], positions[None])
    allowed = allowed[None, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)


def prepared_masks(attn: str, doc: torch.Tensor, group: torch.Tensor, rules: dict, dtype: torch.dtype
                   ) -> Callable[[], dict]:
    """A function making a mask per layer type of `layer_rules` from the ids (int ``[1, L]``) for ``attn``: omni's
    `OmniBlockMask` (the token rule; its window on the causal part, the same pairs while no image is longer than the
    window), Flex's ``BlockMask``, sdpa's dense bool ``[1, 1, L, L]`` (True: attend) or eager's additive one in
    ``dtype``."""
    if attn == "omni":
        return lambda: {layer_type: OmniBlockMask.from_token_ids(doc, group if images else None, window=window)
                        for layer_type, (images, window) in rules.items()}
    mods = mask_mods(doc, group, rules)
    if attn == "flex_attention":
        return lambda: flex_block_masks(mods, doc)
    return lambda: {layer_type: dense_mask(mod, doc.shape[1], doc.device, dtype if attn == "eager" else None)
                    for layer_type, mod in mods.items()}


def no_attention(module, query: torch.Tensor, key, value, attention_mask, **kwargs) -> tuple[torch.Tensor, None]:
    """The ``no_attention`` baseline: each query row ``[B, H, L, D]`` passes through as its own output ``[B, L, H, D]``
    (gradients flow to the query projection), so a step on it times everything but attention."""
    return query.transpose(1, 2), None


transformers.AttentionInterface.register(BASELINE, no_attention)
transformers.masking_utils.AttentionMaskInterface.register(BASELINE, lambda *args, **kwargs: None)


def chunked_lm_loss(model, inputs: dict, chunk: int) -> torch.Tensor:
    """The model's next-token loss (mean over labelled positions, Transformers' shift) with the LM head and the
    cross-entropy run ``chunk`` positions at a time and recomputed in the backward, so the fp32 logits
    ``[L, vocab]`` of a row never exist at once (a 16k row of Gemma3's 262k vocabulary: 17 GB)."""
    labels = inputs["labels"]
    hidden = model.model(**{key: value for key, value in inputs.items() if key != "labels"}).last_hidden_state
    targets = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]

    def summed_loss(hidden_chunk: torch.Tensor, target_chunk: torch.Tensor) -> torch.Tensor:
        logits = model.lm_head(hidden_chunk).float()  # as the image-text models here: no final logit soft-cap
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), target_chunk.flatten(), ignore_index=-100,
                                                 reduction="sum")

    total = sum(torch.utils.checkpoint.checkpoint(summed_loss, hidden[:, start:start + chunk],
                                                  targets[:, start:start + chunk], use_reentrant=False)
                for start in range(0, labels.shape[1], chunk))
    return total / (targets != -100).sum()


def train_step(model, optimizer, inputs: dict, loss_chunk: int = 0) -> float:
    """One forward, backward and optimizer step; the loss chunked by `chunked_lm_loss` when ``loss_chunk`` > 0."""
    loss = chunked_lm_loss(model, inputs, loss_chunk) if loss_chunk else model(**inputs).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def optimizer_for(model) -> torch.optim.Optimizer:
    parameters = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(parameters, lr=2e-4, weight_decay=0.0, fused=parameters[0].is_cuda)


# ---------------------------------------------------------------------- parts


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / GIB, 2) if torch.cuda.is_available() else None


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def failure(error: BaseException) -> dict:
    """A record of a case that did not run: out of memory, or another error (its type and first line)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return {"status": "oom"}
    return {"status": "error", "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}


def speed(arch: str, length: int, attn: str, args, context: dict) -> dict:
    """tokens/s (median step) and peak memory of ``args.steps`` timed steps after ``args.warmup``; an OOM or an
    error is recorded as the case's status."""
    record = {"part": "speed", "arch": arch, "length": length, "attn": attn, "pixels": args.pixels,
              "vision_attn": vision_attention(attn, args)}
    if attn == "flex_attention" and ARCHS[arch](args.tiny).model_type in FLEX_UNMARKED:
        record["flex_forced"] = True
    try:
        record |= _timed_steps(arch, length, attn, args, context)
    except Exception as error:  # noqa: BLE001 -- recorded: an OOM, or a backend that cannot run the case
        record |= failure(error)
    free_memory()  # the case's model, optimizer and activations went with `_timed_steps`'s frame
    return record


def _timed_steps(arch: str, length: int, attn: str, args, context: dict) -> dict:
    model = build_model(arch, attn, args.tiny, args.seed, context["device"], context["dtype"],
                        vision_attention(attn, args))
    batch, counts = packed_row(model.config, length, args.seed, context["sizes"], context["dtype"])
    make_inputs = step_inputs(model, batch, attn, context["device"], args.pixels)
    optimizer = optimizer_for(model)
    losses = [train_step(model, optimizer, make_inputs(), args.loss_chunk) for _ in range(args.warmup)]
    synchronize()
    free_memory()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        losses.append(train_step(model, optimizer, make_inputs(), args.loss_chunk))
        synchronize()
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    return counts | {"status": "ok", "step_ms": round(1e3 * step_s, 1), "tokens_per_s": round(length / step_s),
                     "peak_gib": peak_gib(), "losses": losses}


def longest_fitting(fits_at: Callable[[int], bool], start: int, cap: int, resolution: int) -> tuple[int | None, list]:
    """The longest length (a multiple of ``resolution``, at most ``cap``) at which ``fits_at`` holds, assuming it
    holds below any length where it does: doubling from ``start`` until it fails or reaches ``cap``, then bisection
    between the last length that fitted and the first that did not. None when ``start`` does not fit. Also returns
    the probes as ``(length, fitted)`` in order."""
    probes = []

    def probe(length: int) -> bool:
        probes.append((length, fits_at(length)))
        return probes[-1][1]

    if not probe(start):
        return None, probes
    good, bad = start, None
    while bad is None and good < cap:
        length = min(2 * good, cap)
        good, bad = (length, None) if probe(length) else (good, length)
    while bad is not None and bad - good > resolution:
        middle = (good + bad) // 2 // resolution * resolution
        if middle <= good:
            break
        good, bad = (middle, bad) if probe(middle) else (good, middle)
    return good, probes


def max_length(arch: str, attn: str, args, context: dict) -> dict:
    """The longest row one training step (optimizer states included) runs at, by `longest_fitting`; each probe's
    status is kept (an ``error`` instead of ``oom`` means the boundary is not memory)."""
    one_step = dataclasses.replace(args, warmup=0, steps=1)
    status = {}

    def fits_at(length: int) -> bool:
        status[length] = speed(arch, length, attn, one_step, context)["status"]
        return status[length] == "ok"

    found, probes = longest_fitting(fits_at, args.max_length_start, args.max_length_cap, args.max_length_resolution)
    return {"part": "max_length", "arch": arch, "attn": attn, "max_length": found,
            "capped": found == args.max_length_cap, "probes": [(length, status[length]) for length, _ in probes]}


def curve(arch: str, length: int, args, context: dict) -> dict:
    """The losses of ``args.curve_steps`` steps of each backend of ``args.curve_attn`` from the same weights on the
    same rows, and each one's largest gap to the first's (omni's by default)."""
    record = {"part": "curve", "arch": arch, "length": length, "steps": args.curve_steps, "pixels": args.pixels,
              "losses": {}}
    for attn in args.curve_attn:
        try:
            record["losses"][attn] = _losses(arch, length, attn, args, context)
        except Exception as error:  # noqa: BLE001
            record["losses"][attn] = failure(error)
        free_memory()
    first, curves = args.curve_attn[0], {attn: r for attn, r in record["losses"].items() if isinstance(r, list)}
    if first in curves:
        record["loss_start_end"] = [curves[first][0], curves[first][-1]]
        record["gaps"] = {attn: loss_gaps(curves[first], losses) for attn, losses in curves.items() if attn != first}
    return record


def loss_gaps(reference: list[float], losses: list[float]) -> dict:
    """The largest absolute and relative differences of ``losses`` from ``reference``, step by step."""
    gaps = np.abs(np.array(losses) - np.array(reference))
    return {"max_abs_diff": float(gaps.max()), "max_rel_diff": float((gaps / np.abs(reference)).max())}


def _losses(arch: str, length: int, attn: str, args, context: dict) -> list[float]:
    model = build_model(arch, attn, args.tiny, args.seed, context["device"], context["dtype"],
                        vision_attention(attn, args))
    optimizer = optimizer_for(model)
    losses = []
    for step in range(args.curve_steps):
        batch, _ = packed_row(model.config, length, args.seed + 1 + step, context["sizes"], context["dtype"])
        inputs = step_inputs(model, batch, attn, context["device"], args.pixels)()
        losses.append(train_step(model, optimizer, inputs, args.loss_chunk))
    return losses


# ---------------------------------------------------------------------- report


def table(records: list[dict]) -> str:
    """Speed (tokens/s, peak GiB, omni's speedups), longest rows and the curves' agreement, as text."""
    lines = []
    speeds = [r for r in records if r["part"] == "speed"]
    for arch, length in dict.fromkeys((r["arch"], r["length"]) for r in speeds):
        cells = {r["attn"]: r for r in speeds if (r["arch"], r["length"]) == (arch, length)}
        text = [f"{attn} " + (f"{r['tokens_per_s']:,} tok/s {r['peak_gib']} GiB" if r["status"] == "ok"
                              else r["status"] + (f" ({r['error'][:60]})" if "error" in r else ""))
                for attn, r in cells.items()]
        others = {attn: r for attn, r in cells.items() if attn not in ("omni", BASELINE) and r["status"] == "ok"
                  and cells.get("omni", {}).get("status") == "ok"}
        ratios = [f"omni/{attn} {cells['omni']['tokens_per_s'] / r['tokens_per_s']:.2f}x" for attn, r in others.items()]
        gaps = [f"loss max |omni - {attn}| {loss_gaps(cells['omni']['losses'], r['losses'])['max_abs_diff']:.2e}"
                for attn, r in others.items()]
        lines.append(f"{arch} {length}: " + "; ".join(text + ratios + attention_share(cells) + gaps))
    for r in (r for r in records if r["part"] == "max_length"):
        lines.append(f"{r['arch']} longest row, {r['attn']}: {r['max_length']}" + (" (the cap)" if r["capped"] else ""))
    for r in (r for r in records if r["part"] == "curve"):
        first = next(iter(r["losses"]))
        failed = [f"{attn} {json.dumps(losses)}" for attn, losses in r["losses"].items() if isinstance(losses, dict)]
        summary = ([f"{first} loss {r['loss_start_end'][0]:.3f} -> {r['loss_start_end'][1]:.3f}"]
                   if "loss_start_end" in r else [])
        summary += [f"max |{first} - {attn}| {gap['max_abs_diff']:.4f} (relative {gap['max_rel_diff']:.2e})"
                    for attn, gap in r.get("gaps", {}).items()]
        lines.append(f"{r['arch']} {r['length']} curve, {r['steps']} steps: " + "; ".join(summary + failed))
    return "\n".join(lines)


def attention_share(cells: dict[str, dict]) -> list[str]:
    """With a ``no_attention`` step beside them: each backend's attention time (its step minus the baseline's) and
    its share of its step, e.g. ``["attention ms omni 210 (22%), sdpa 1330 (64%)"]``; nothing without a baseline."""
    base = cells.get(BASELINE, {})
    timed = {attn: r["step_ms"] for attn, r in cells.items() if attn != BASELINE and r["status"] == "ok"}
    if base.get("status") != "ok" or not timed:
        return []
    return ["attention ms " + ", ".join(f"{attn} {ms - base['step_ms']:.0f} ({(ms - base['step_ms']) / ms:.0%})"
                                         for attn, ms in timed.items())]


def environment(context: dict) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
            "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "dtype": str(context["dtype"]), "date": now.isoformat(timespec="seconds"),
            "OMNI_HF_BACKEND": os.environ.get("OMNI_HF_BACKEND")}


@dataclasses.dataclass(frozen=True)
class Args:
    archs: tuple[str, ...]
    lengths: tuple[int, ...]
    attn: tuple[str, ...]
    steps: int
    warmup: int
    curve_steps: int
    curve_attn: tuple[str, ...]
    find_max_length: bool
    max_length_start: int
    max_length_cap: int
    max_length_resolution: int
    loss_chunk: int
    pixels: bool
    vision_attn: str
    tiny: bool
    seed: int
    out: Path


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", choices=list(ARCHS), default=list(DEFAULT_ARCHS))
    parser.add_argument("--lengths", nargs="+", type=int, default=None, help="row lengths (default 8192 16384; "
                                                                              "tiny: 256 512)")
    parser.add_argument("--attn", nargs="+", choices=[*BACKENDS, BASELINE], default=list(DEFAULT_BACKENDS))
    parser.add_argument("--steps", type=int, default=None, help="timed steps per case (default 10, tiny 2; 0: no "
                                                                "speed part)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3, tiny 1)")
    parser.add_argument("--curve-steps", type=int, default=None, help="omni vs sdpa loss curve (default 50, tiny 3; "
                                                                      "0: none)")
    parser.add_argument("--curve-attn", nargs="+", choices=BACKENDS, default=["omni", "sdpa"],
                        help="the curve's backends; each one's losses are compared with the first's (default omni "
                             "sdpa)")
    parser.add_argument("--find-max-length", action="store_true", help="search the longest row per arch and backend")
    parser.add_argument("--max-length-start", type=int, default=None, help="default 8192, tiny 256")
    parser.add_argument("--max-length-cap", type=int, default=None, help="default 262144, tiny 1024")
    parser.add_argument("--max-length-resolution", type=int, default=None, help="default 1024, tiny 128")
    parser.add_argument("--loss-chunk", type=int, default=0, help="positions per chunk of the LM head and loss "
                                                                    "(chunked_lm_loss; default 0: the model's own)")
    parser.add_argument("--pixels", action="store_true", help="the step starts from the pixels: the frozen vision "
                        "tower runs in it, on omni in omni's rows")
    parser.add_argument("--vision-attn", choices=["backend", "sdpa"], default="backend",
                        help="with --pixels: the tower on the row's backend (omni, the baseline) or on sdpa in every "
                             "row")
    parser.add_argument("--tiny", action="store_true", help="tiny configs and rows, on the CPU unless a GPU is there")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT or benchmarks/results)")
    a = parser.parse_args(argv)
    tiny = a.tiny

    def default(value, real, small):
        return value if value is not None else (small if tiny else real)

    out = a.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS)
    return Args(tuple(a.archs), tuple(default(a.lengths, [8192, 16384], [256, 512])), tuple(a.attn),
                default(a.steps, 10, 2), default(a.warmup, 3, 1), default(a.curve_steps, 50, 3), tuple(a.curve_attn),
                a.find_max_length,
                default(a.max_length_start, 8192, 256), default(a.max_length_cap, 262144, 1024),
                default(a.max_length_resolution, 1024, 128), a.loss_chunk, a.pixels, a.vision_attn, tiny, a.seed, out)


def result_name(args: Args) -> str:
    """``vlm_training_<archs>_<lengths>_<backends>_<parts>[-pixels][_tiny].json`` (no lengths when only the longest row
    is searched): runs of separate parts never overwrite each other."""
    parts = [name for name, on in (("speed", args.steps), ("maxlen", args.find_max_length),
                                   ("curve", args.curve_steps), ("pixels", args.pixels),
                                   ("sdpa-tower", args.pixels and args.vision_attn == "sdpa")) if on]
    lengths = [map(str, args.lengths)] if args.steps or args.curve_steps else []
    fields = [args.archs, *lengths, args.attn, parts]
    return "_".join(["vlm_training", *("-".join(field) for field in fields)]) + ("_tiny" if args.tiny else "") + ".json"


def start_run(module: str, argv: list[str] | None) -> tuple[dict, dict]:
    """What a benchmark run of ``module`` starts from: the context (``device``, ``dtype``: bf16 on a GPU, where a
    case the kernels cannot run is an error rather than timed on the reference; float32 on the CPU) and the result
    (``meta``: the environment and the command line; ``records`` empty), its first line printed."""
    cuda = torch.cuda.is_available()
    if cuda:
        os.environ.setdefault("OMNI_HF_BACKEND", "cuda")
    context = {"device": torch.device("cuda" if cuda else "cpu"), "dtype": torch.bfloat16 if cuda else torch.float32}
    command = f"python -m {module} " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv))
    result = {"meta": environment(context) | {"command": command}, "records": []}
    print(f"{result['meta']['device']}, torch {torch.__version__}, transformers {transformers.__version__}: {command}",
          flush=True)
    return context, result


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    context, result = start_run("benchmarks.bench_vlm_training", argv)
    context["sizes"] = TINY if args.tiny else REAL
    path = args.out / result_name(args)
    args.out.mkdir(parents=True, exist_ok=True)
    todo = []  # (what, part)
    if args.steps:
        todo += [(f"speed {arch} {n} {attn}", lambda a=arch, n=n, t=attn: speed(a, n, t, args, context))
                 for arch in args.archs for n in args.lengths for attn in args.attn]
    if args.find_max_length:
        todo += [(f"longest row {arch} {attn}", lambda a=arch, t=attn: max_length(a, t, args, context))
                 for arch in args.archs for attn in args.attn]
    if args.curve_steps:
        todo.append((f"curve {args.archs[0]} {min(args.lengths)} {' '.join(args.curve_attn)}",
                     lambda: curve(args.archs[0], min(args.lengths), args, context)))
    for index, (what, part) in enumerate(todo, 1):
        print(f"[{index}/{len(todo)}] {what} ...", flush=True)
        start = time.time()
        result["records"].append(part())
        print(f"[{index}/{len(todo)}] {json.dumps(result['records'][-1])[:400]} ({time.time() - start:.0f} s)",
              flush=True)
        path.write_text(json.dumps(result, indent=1) + "\n")  # after every part: a run cut short keeps its results
    print(table(result["records"]))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
