"""What a VLM's samples look like to `OmniCollator`: where the images sit among the tokens, how the model's
language model attends to them, and how each of its vision inputs packs.

`VisionInputs` holds these settings; `VisionInputs.from_config` (a model config) and
`VisionInputs.from_processor` (a Transformers processor) fill them in for the families in `FAMILIES`.
`omni_hf.data.images` finds a processed sample's images by these settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["FAMILIES", "IMAGE_ATTENTION", "PROCESSORS", "VisionInputs"]

IMAGE_ATTENTION = ("causal", "bidirectional", "prefix")


@dataclasses.dataclass(frozen=True)
class VisionInputs:
    """A model family's image tokens and vision inputs, as `OmniCollator` reads them from each sample.

    Attributes:
        image_token_ids: token ids that stand for image features; each image is a contiguous run of them.
        image_type_key: instead of ``image_token_ids``, a per-token key (one of ``token_keys``) whose value 1
            marks image tokens (``token_type_ids`` of Gemma3, ``mm_token_type_ids`` of Qwen2-VL).
        tokens_per_image: every image's token count (Gemma3's ``mm_tokens_per_image``, a SmolVLM sub-image's
            ``image_seq_len``), or None: the sample's image tokens shared equally among its images (or, with
            ``mrope_merge_size``, read from ``image_grid_thw``).
        mrope_merge_size: Qwen2-VL / Qwen2.5-VL: image ``k`` has ``t * h * w / merge_size**2`` tokens for row
            ``k = (t, h, w)`` of ``image_grid_thw`` (int ``[n_images, 3]``, in patches), and ``position_ids``
            become the model's 3-D rotary positions; None for other families.
        image_attention: how the language model attends to image tokens: ``"causal"`` (as text: Qwen2-VL,
            LLaVA, Idefics3, SmolVLM), ``"bidirectional"`` (each image one block: Gemma3) or ``"prefix"``
            (the run of ``token_type_ids == 0`` at the start, image and prompt, one block: PaliGemma).
        token_keys: per-token inputs ``[n]`` (or ``[1, n]``), packed like ``input_ids`` with 0 on padding.
        image_keys: per-sample vision inputs and the dim along which a batch concatenates them in packed
            order: 0 for ``[n, ...]`` values (``pixel_values`` of Gemma3 / LLaVA, the patch rows of Qwen2-VL,
            ``image_grid_thw``), 1 for ``[1, n, ...]`` values (Idefics3 / SmolVLM ``pixel_values`` and
            ``pixel_attention_mask``, zero-padded to the batch's largest image as their processor pads).
        count_key: the image key whose size along its dim is the sample's number of images.
        first_position: position id of a sample's first token (PaliGemma counts from 1).
    """

    image_token_ids: tuple[int, ...] = ()
    image_type_key: str | None = None
    tokens_per_image: int | None = None
    mrope_merge_size: int | None = None
    image_attention: str = "causal"
    token_keys: tuple[str, ...] = ()
    image_keys: Mapping[str, int] = dataclasses.field(default_factory=dict)
    count_key: str | None = None
    first_position: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_keys", dict(self.image_keys))  # its own copy (the families share theirs)
        if (len(self.image_token_ids) > 0) == (self.image_type_key is not None):
            raise ValueError(f"image_token_ids / image_type_key: expected exactly one of them, got "
                             f"{self.image_token_ids!r} and {self.image_type_key!r}")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.image_token_ids):
            raise ValueError(f"image_token_ids: expected a tuple of ints, got {self.image_token_ids!r}")
        if self.image_type_key is not None and self.image_type_key not in self.token_keys:
            raise ValueError(f"image_type_key: expected one of token_keys {self.token_keys}, got "
                             f"{self.image_type_key!r}")
        if self.image_attention not in IMAGE_ATTENTION:
            raise ValueError(f"image_attention: expected one of {IMAGE_ATTENTION}, got {self.image_attention!r}")
        if self.image_attention == "prefix" and "token_type_ids" not in self.token_keys:
            raise ValueError(f"token_keys: expected 'token_type_ids' among them with image_attention='prefix', got "
                             f"{self.token_keys}")
        for name in ("tokens_per_image", "mrope_merge_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {value!r}")
        if self.tokens_per_image is not None and self.mrope_merge_size is not None:
            raise ValueError("tokens_per_image / mrope_merge_size: expected at most one of them, got both")
        if any(dim not in (0, 1) for dim in self.image_keys.values()):
            raise ValueError(f"image_keys: expected a dim of 0 or 1 for each key, got {dict(self.image_keys)}")
        count = "image_grid_thw" if self.mrope_merge_size is not None else self.count_key
        if count is None or count not in self.image_keys:
            raise ValueError(f"count_key: expected one of image_keys {tuple(self.image_keys)} "
                             f"{'(image_grid_thw with mrope_merge_size)' if self.mrope_merge_size else ''}, "
                             f"got {self.count_key!r}")

    @property
    def keys(self) -> frozenset[str]:
        """Every sample key these settings read besides ``input_ids``."""
        return frozenset(self.token_keys) | frozenset(self.image_keys)

    @classmethod
    def from_config(cls, config: Any, image_attention: str | None = None) -> VisionInputs:
        """The settings of ``config``'s family (``config.model_type`` in `FAMILIES`), read from the config.

        ``image_attention`` overrides the family's (e.g. ``"bidirectional"`` to fine-tune a causal-image model
        with bidirectional image blocks).
        """
        family = _family(getattr(config, "model_type", None), "config.model_type")
        return family.settings(config=config, image_attention=image_attention)

    @classmethod
    def from_processor(cls, processor: Any, image_attention: str | None = None) -> VisionInputs:
        """The settings of ``processor``'s family (its class in `PROCESSORS`), read from the processor."""
        model_type = PROCESSORS.get(type(processor).__name__)
        if model_type is None:
            raise ValueError(f"processor: expected one of {tuple(PROCESSORS)}, got {type(processor).__name__} "
                             "(for another model, build VisionInputs(...) and pass it as OmniCollator(vision=...))")
        return FAMILIES[model_type].settings(processor=processor, image_attention=image_attention)


# ---------------------------------------------------------------------- model families


@dataclasses.dataclass(frozen=True)
class _Family:
    """What is fixed for a model family; `settings` adds the numbers a config or processor gives."""

    image_attention: str
    token_keys: tuple[str, ...]
    image_keys: Mapping[str, int]
    count_key: str
    sizes: str  # how images are sized: "mrope" (image_grid_thw), "fixed" (tokens_per_image) or "equal"
    first_position: int = 0

    def settings(self, *, config: Any = None, processor: Any = None, image_attention: str | None) -> VisionInputs:
        if config is not None:
            token, size = _image_token_id(config), _config_size(config, self.sizes)
        else:
            token, size = _processor_image_token_id(processor), _processor_size(processor, self.sizes)
        return VisionInputs(
            image_token_ids=(token,),
            tokens_per_image=size if self.sizes == "fixed" else None,
            mrope_merge_size=size if self.sizes == "mrope" else None,
            image_attention=image_attention or self.image_attention,
            token_keys=self.token_keys, image_keys=self.image_keys, count_key=self.count_key,
            first_position=self.first_position)


_PIXELS = {"pixel_values": 0}
_QWEN = _Family("causal", ("mm_token_type_ids",), {"pixel_values": 0, "image_grid_thw": 0}, "image_grid_thw", "mrope")
_IDEFICS = _Family("causal", (), {"pixel_values": 1, "pixel_attention_mask": 1}, "pixel_values", "fixed")

FAMILIES: dict[str, _Family] = {
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": _QWEN,
    "gemma3": _Family("bidirectional", ("token_type_ids",), _PIXELS, "pixel_values", "fixed"),
    "paligemma": _Family("prefix", ("token_type_ids",), _PIXELS, "pixel_values", "fixed", first_position=1),
    "llava": _Family("causal", (), _PIXELS, "pixel_values", "equal"),
    "idefics3": _IDEFICS,
    "smolvlm": _IDEFICS,
}
PROCESSORS = {"Qwen2VLProcessor": "qwen2_vl", "Qwen2_5_VLProcessor": "qwen2_5_vl", "Gemma3Processor": "gemma3",
              "PaliGemmaProcessor": "paligemma", "LlavaProcessor": "llava", "Idefics3Processor": "idefics3",
              "SmolVLMProcessor": "smolvlm"}


def _family(model_type: Any, name: str) -> _Family:
    if model_type not in FAMILIES:
        raise ValueError(f"{name}: expected one of {tuple(FAMILIES)}, got {model_type!r} (for another model, build "
                         "VisionInputs(...) and pass it as OmniCollator(vision=...))")
    return FAMILIES[model_type]


def _image_token_id(config: Any) -> int:
    for name in ("image_token_id", "image_token_index"):
        if isinstance(value := getattr(config, name, None), int):
            return value
    raise ValueError(f"config: expected an int image_token_id, got {getattr(config, 'image_token_id', None)!r}")


def _config_size(config: Any, sizes: str) -> int | None:
    """The config's merge size ("mrope"), tokens per image ("fixed"), or None ("equal")."""
    vision = config.vision_config
    if sizes == "equal":
        return None
    if sizes == "mrope":
        return vision.spatial_merge_size
    if config.model_type == "gemma3":
        return config.mm_tokens_per_image
    if config.model_type == "paligemma":
        return (vision.image_size // vision.patch_size) ** 2
    return int((vision.image_size // vision.patch_size) ** 2 // config.scale_factor ** 2)  # idefics3, smolvlm


def _processor_image_token_id(processor: Any) -> int:
    """The id of the token that stands for image features (Gemma3's processor names its ``<start_of_image>``
    placeholder ``image_token_id``; its ``image_token_ids`` has the expanded token)."""
    ids = [i for i in getattr(processor, "image_token_ids", None) or [processor.image_token_id] if i is not None]
    if len(ids) != 1 or not isinstance(ids[0], int):
        raise ValueError(f"processor: expected one image token id, got {ids!r}")
    return ids[0]


def _processor_size(processor: Any, sizes: str) -> int | None:
    """The processor's merge size ("mrope"), tokens per image ("fixed"), or None ("equal")."""
    if sizes == "equal":
        return None
    if sizes == "mrope":
        return processor.image_processor.merge_size
    for name in ("image_seq_length", "image_seq_len"):  # gemma3, paligemma / idefics3, smolvlm
        if isinstance(value := getattr(processor, name, None), int):
            return value
    raise ValueError(f"processor: expected an int image_seq_length or image_seq_len, got none on "
                     f"{type(processor).__name__}")
