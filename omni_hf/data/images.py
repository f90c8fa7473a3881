"""The images of one processed sample: where a model family's processor put them among the tokens (per
`VisionInputs`), checked against the sample's vision inputs, the token ranges that attend both ways, and Qwen2-VL's
3-D rotary positions. `OmniCollator` reads each processed sample through `find_images`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from .vision_inputs import VisionInputs

__all__ = ["SampleImages", "find_images"]


class SampleImages(NamedTuple):
    """One sample's images, found and checked."""

    spans: np.ndarray  # int64 [k, 2]: token ranges that attend both ways (by vision.image_attention)
    image_tokens: np.ndarray  # bool [n]: tokens that stand for image features
    rope: np.ndarray | None  # int64 [3, n]: 3-D rotary positions (vision.mrope_merge_size), else None
    images: dict[str, torch.Tensor]  # vision.image_keys


def find_images(sample: Mapping[str, Any], input_ids: np.ndarray, token_values: dict[str, np.ndarray],
                vision: VisionInputs, index: int) -> SampleImages:
    """Find and check the images of ``samples[index]`` (``input_ids`` int64 ``[n]`` and ``token_values``, its
    ``vision.token_keys`` as int64 ``[n]``, already read); errors name ``samples[index][key]``."""
    images = _image_values(sample, index, vision)
    image_tokens = _image_tokens(input_ids, token_values, vision, index)
    starts, sizes = _find_images(image_tokens, images, vision, index)
    rope = None if vision.mrope_merge_size is None else _mrope(len(input_ids), starts, sizes, images, vision)
    return SampleImages(_image_spans(starts, sizes, token_values, vision, index), image_tokens, rope, images)


def _image_values(sample: Mapping[str, Any], index: int, vision: VisionInputs) -> dict[str, torch.Tensor]:
    """The sample's ``vision.image_keys`` as tensors: ``[n, ...]`` (dim 0) or ``[1, n, ...]`` (dim 1)."""
    images = {}
    for key, dim in vision.image_keys.items():
        if sample.get(key) is None:
            continue
        value = torch.as_tensor(sample[key])
        if value.ndim < dim + 1 or (dim == 1 and value.shape[0] != 1):
            raise ValueError(f"samples[{index}]['{key}']: expected shape {'[1, n, ...]' if dim else '[n, ...]'} "
                             f"(one sample's values), got {list(value.shape)}")
        images[key] = value
    return images


def _image_tokens(input_ids: np.ndarray, token_values: dict[str, np.ndarray], vision: VisionInputs,
                  index: int) -> np.ndarray:
    """bool ``[n]``: the tokens that stand for image features."""
    if vision.image_token_ids:
        return np.isin(input_ids, vision.image_token_ids)
    if vision.image_type_key not in token_values:
        raise ValueError(f"samples[{index}]['{vision.image_type_key}']: expected per-token types (1 = image token; "
                         "vision.image_type_key), got no such key")
    return token_values[vision.image_type_key] == 1


def _find_images(image_tokens: np.ndarray, images: dict[str, torch.Tensor], vision: VisionInputs,
                 index: int) -> tuple[np.ndarray, np.ndarray]:
    """First token and token count of each image, int64 ``[n_images]``, checked against the vision inputs: the
    image tokens are exactly the images' tokens, and each image's are contiguous (with Qwen2-VL's 3-D
    positions, each image is a whole run of image tokens, as its ``get_rope_index`` needs)."""
    sizes, source = _image_sizes(images, vision, int(image_tokens.sum()), index)
    positions = np.flatnonzero(image_tokens)
    if sizes.sum() != len(positions):
        raise ValueError(f"samples[{index}]['input_ids']: expected {int(sizes.sum())} image tokens ({len(sizes)} "
                         f"images of {sizes.tolist()} tokens, {source}), got {len(positions)}")
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    starts, ends = positions[bounds[:-1]], positions[bounds[1:] - 1] + 1
    runs = _runs(image_tokens)
    whole = ((ends - starts) == sizes).all() and (vision.mrope_merge_size is None or len(runs) == len(sizes))
    if not whole:
        expected = "one run per image" if vision.mrope_merge_size is not None else "runs that split into images"
        raise ValueError(f"samples[{index}]['input_ids']: expected image-token {expected} of {sizes.tolist()} tokens "
                         f"({source}), got runs of {runs.tolist()} tokens")
    return starts, sizes


def _image_sizes(images: dict[str, torch.Tensor], vision: VisionInputs, image_tokens: int,
                 index: int) -> tuple[np.ndarray, str]:
    """int64 ``[n_images]`` tokens of each image, and where the sizes come from (for messages)."""
    missing = [key for key in dict.fromkeys(("pixel_values", vision.count_key))
               if key in vision.image_keys and key not in images]
    if image_tokens and missing:
        raise ValueError(f"samples[{index}]['{missing[0]}']: expected the vision inputs of the sample's "
                         f"{image_tokens} image tokens, got no such key")
    if vision.mrope_merge_size is not None:
        return _grid_sizes(images, vision.mrope_merge_size, index)
    count = vision.count_key
    n = images[count].shape[vision.image_keys[count]] if count in images else 0
    source = f"{n} images in {count}"
    if vision.tokens_per_image is not None:
        return np.full(n, vision.tokens_per_image, dtype=np.int64), f"{source}, tokens_per_image"
    if n and (image_tokens == 0 or image_tokens % n):
        raise ValueError(f"samples[{index}]['input_ids']: expected a positive multiple of {n} image tokens (an equal "
                         f"share for each of the {source}), got {image_tokens}")
    return np.full(n, image_tokens // max(n, 1), dtype=np.int64), f"{source}, an equal share"


def _grid_sizes(images: dict[str, torch.Tensor], merge: int, index: int) -> tuple[np.ndarray, str]:
    """Qwen2-VL: tokens of each image from ``image_grid_thw`` ``[n, 3]``; its ``pixel_values`` must hold the
    grids' patch rows."""
    grid = images.get("image_grid_thw")
    if grid is None:
        if "pixel_values" in images:
            raise ValueError(f"samples[{index}]['image_grid_thw']: expected the grid of each image of pixel_values, "
                             "got no such key")
        return np.zeros(0, dtype=np.int64), "no image_grid_thw"
    grid = grid.numpy().astype(np.int64)
    patches = grid.prod(-1) if grid.ndim == 2 and grid.shape[1] == 3 else None
    if patches is None or (patches <= 0).any() or (patches % merge**2).any():
        raise ValueError(f"samples[{index}]['image_grid_thw']: expected rows (t, h, w) of positive ints with h * w a "
                         f"multiple of merge_size**2 = {merge**2}, got {grid.tolist()}")
    rows = images["pixel_values"].shape[0] if "pixel_values" in images else None
    if rows != patches.sum():
        raise ValueError(f"samples[{index}]['pixel_values']: expected {int(patches.sum())} patch rows (the sum of "
                         f"t * h * w over image_grid_thw), got {rows if rows is not None else 'no pixel_values'}")
    return patches // merge**2, f"image_grid_thw: t * h * w / {merge**2}"


def _runs(flags: np.ndarray) -> np.ndarray:
    """int64 lengths of the runs of True in ``flags``, in order."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], flags, [False]]).astype(np.int8)))
    return edges[1::2] - edges[0::2]


def _image_spans(starts: np.ndarray, sizes: np.ndarray, token_values: dict[str, np.ndarray], vision: VisionInputs,
                 index: int) -> np.ndarray:
    """int64 ``[k, 2]`` token ranges that attend both ways, by ``vision.image_attention``."""
    if vision.image_attention == "bidirectional":
        return np.stack([starts, starts + sizes], axis=1)
    if vision.image_attention == "causal":
        return np.empty((0, 2), dtype=np.int64)
    types = token_values.get("token_type_ids")
    if types is None:
        raise ValueError(f"samples[{index}]['token_type_ids']: expected 0 on the prefix and 1 on the suffix "
                         "(image_attention='prefix'), got no such key")
    suffix = types != 0
    prefix = int(np.argmax(suffix)) if suffix.any() else len(types)
    if not suffix[prefix:].all():
        raise ValueError(f"samples[{index}]['token_type_ids']: expected 0 on a prefix, then 1 (image_attention="
                         f"'prefix'), got a 0 at token {prefix + int(np.argmin(suffix[prefix:]))} after the prefix")
    return np.array([[0, prefix]] if prefix else [], dtype=np.int64).reshape(-1, 2)


def _mrope(n: int, starts: np.ndarray, sizes: np.ndarray, images: dict[str, torch.Tensor],
           vision: VisionInputs) -> np.ndarray:
    """int64 ``[3, n]``: Qwen2-VL's 3-D rotary positions of one sample (its ``get_rope_index`` for images).

    A text token's three positions are its index among the positions so far; an image of ``t x h x w`` merged
    patches starting at position ``p`` puts token ``(i, j, k)`` at ``(p + i, p + j, p + k)``, and the text after
    it continues at ``p + max(h, w)``.
    """
    merge = vision.mrope_merge_size
    grid = images["image_grid_thw"].numpy().astype(np.int64) if len(sizes) else np.zeros((0, 3), dtype=np.int64)
    height, width = grid[:, 1] // merge, grid[:, 2] // merge
    owner = np.repeat(np.arange(len(sizes)), sizes)  # image of each image token
    local = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # token index in its image
    where = starts[owner] + local
    advance = np.ones(n, dtype=np.int64)
    advance[where] = 0
    advance[starts + sizes - 1] = np.maximum(height, width)
    rope = np.repeat((np.cumsum(advance) - advance)[None], 3, axis=0)
    plane = (height * width)[owner]
    rope[:, where] += np.stack([local // plane, local // width[owner] % height[owner], local % width[owner]])
    return rope
