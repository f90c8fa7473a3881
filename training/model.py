"""A decoder-only VLM in the Fuyu style: image patches, linearly projected, stand in for ``<image>`` tokens.

There is no vision tower: each ``patch x patch`` RGB patch is flattened, projected to the LM's hidden size
and given a learned position embedding; the result replaces the embedding of one ``<image>`` placeholder
token. The language model is any Transformers causal LM (a Llama built from a config here, or a local
checkpoint), so the attention backend is the LM's ``attn_implementation``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """Geometry of the images and the id of the placeholder token each patch replaces."""

    image_size: int
    patch_size: int
    image_token_id: int
    channels: int = 3

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def patch_dim(self) -> int:
        return self.channels * self.patch_size**2


@dataclasses.dataclass(frozen=True)
class LMShape:
    """The size of a Llama built from scratch (head dim = hidden / heads)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


def build_lm(shape: LMShape, vocab_size: int, max_positions: int, attn: str) -> PreTrainedModel:
    """A randomly initialised `LlamaForCausalLM` of ``shape`` using attention backend ``attn``."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                         intermediate_size=shape.intermediate, max_position_embeddings=max_positions,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def load_lm(path: str, vocab_size: int, attn: str) -> PreTrainedModel:
    """A local causal LM checkpoint, its embeddings resized to our vocabulary (new rows are trained)."""
    lm = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn)
    lm.resize_token_embeddings(vocab_size)
    return lm


class VLM(nn.Module):
    """Patch projection + causal LM.

    Args:
        lm: a Transformers causal LM; its input embeddings are looked up for text tokens.
        vision: image geometry and the ``<image>`` token id.
    """

    def __init__(self, lm: PreTrainedModel, vision: VisionConfig) -> None:
        super().__init__()
        self.lm = lm
        self.vision = vision
        hidden = lm.config.hidden_size
        self.patch_proj = nn.Linear(vision.patch_dim, hidden)
        self.patch_pos = nn.Parameter(torch.randn(vision.patches, hidden) * 0.02)

    def embed(self, input_ids: torch.Tensor, pixel_values: torch.Tensor | None) -> torch.Tensor:
        """Input embeddings ``[B, L, hidden]``: token embeddings, with the ``<image>`` positions (row-major)
        filled by the patches of ``pixel_values`` (uint8 ``[..., C, H, W]``, images in the order their
        placeholders appear)."""
        embeds = self.lm.get_input_embeddings()(input_ids)
        is_image = input_ids == self.vision.image_token_id
        if pixel_values is None:
            if is_image.any():
                raise ValueError("pixel_values: expected images for the <image> tokens of input_ids, got None")
            return embeds
        patches = self.embed_images(pixel_values.flatten(0, -4))
        if patches.shape[0] * patches.shape[1] != int(is_image.sum()):
            raise ValueError(f"pixel_values: expected {int(is_image.sum())} patches (one per <image> token), "
                             f"got {patches.shape[0]} images of {patches.shape[1]}")
        return embeds.masked_scatter(is_image[..., None], patches.to(embeds.dtype))

    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``[N, C, H, W]`` -> ``[N, patches, hidden]`` (patches in raster order)."""
        p = self.vision.patch_size
        n, c, h, w = images.shape
        patches = images.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(n, -1, c * p * p)
        pixels = patches.to(self.patch_proj.weight.dtype) / 255 - 0.5
        return self.patch_proj(pixels) + self.patch_pos

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor | None = None,
                **lm_kwargs) -> torch.Tensor:
        """Logits ``[B, L, vocab]``; ``lm_kwargs`` (position ids, masks, omni ids) go to the LM."""
        return self.lm(inputs_embeds=self.embed(input_ids, pixel_values), **lm_kwargs).logits

    def save_pretrained(self, directory: str | Path) -> None:
        """``lm/`` (Transformers format), ``vision.safetensors`` and ``vision.json``."""
        directory = Path(directory)
        self.lm.save_pretrained(directory / "lm")
        own = {name: value.detach().contiguous() for name, value in self.state_dict().items()
               if not name.startswith("lm.")}
        save_file(own, directory / "vision.safetensors")
        (directory / "vision.json").write_text(json.dumps(dataclasses.asdict(self.vision), indent=1))

    @classmethod
    def from_pretrained(cls, directory: str | Path, attn: str) -> VLM:
        directory = Path(directory)
        lm = AutoModelForCausalLM.from_pretrained(directory / "lm", attn_implementation=attn)
        model = cls(lm, VisionConfig(**json.loads((directory / "vision.json").read_text())))
        missing, unexpected = model.load_state_dict(load_file(directory / "vision.safetensors"), strict=False)
        if unexpected or any(not name.startswith("lm.") for name in missing):
            raise ValueError(f"{directory / 'vision.safetensors'}: expected the VLM's own weights, got "
                             f"missing {missing} and unexpected {unexpected}")
        return model
