"""Synthetic interleaved image / text questions: scenes of coloured shapes, answers that need the images.

A sample is one to ``max_images`` images, each introduced by its name, then one question about them:

    <bos> image one <image>x16 image two <image>x16 how many red shapes are in image two ? answer three <eos>

Questions: counting (by colour or by shape), the colour of a shape, the shape of a colour, relative
positions (left of / right of / above / below, yes or no) and comparing images (which image has more of
something). Every question is asked only when its answer is unambiguous.

A scene is a ``grid x grid`` board with at most one shape per cell; a cell is one image patch of the model,
so patch ``i`` shows cell ``i``. The `datasets.Dataset` stores scenes as small integer grids, and pixels
are rendered when a sample is read (`SampleEncoder`, through ``Dataset.with_transform``), so the dataset
takes a few MB and rendering runs in the DataLoader workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from .tokenizer import WordTokenizer

SHAPES = ("circle", "square", "triangle", "diamond")
COLOURS = ("red", "green", "blue", "yellow", "magenta")
RGB = np.array([[220, 50, 40], [40, 190, 70], [50, 100, 235], [235, 215, 40], [210, 60, 210]], dtype=np.int16)
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
RELATIONS = {"left of": (1, -1), "right of": (1, 1), "above": (0, -1), "below": (0, 1)}  # (axis, sign)
TEMPLATE_WORDS = ("image", "how", "many", "shapes", "are", "in", "what", "colour", "is", "the", "shape", "of",
                  "object", "which", "has", "more", "?", "answer", "yes", "no", "left", "right", "above", "below")
WORDS = (*TEMPLATE_WORDS, *SHAPES, *(s + "s" for s in SHAPES), *COLOURS, *NUMBERS)
TASKS = ("count", "colour", "shape", "position", "compare")


@dataclasses.dataclass(frozen=True)
class SceneConfig:
    """Scene geometry: ``grid x grid`` cells of ``cell`` pixels (the model's patch size)."""

    grid: int = 4
    cell: int = 16
    max_objects: int = 5  # per image, at least one
    max_images: int = 3  # per sample

    @property
    def image_size(self) -> int:
        return self.grid * self.cell

    @property
    def patches(self) -> int:
        return self.grid * self.grid


def make_tokenizer() -> WordTokenizer:
    """The tokenizer of every word the questions and answers use."""
    return WordTokenizer(WORDS)


def make_split(config: SceneConfig, size: int, seed: int, num_proc: int | None = None) -> datasets.Dataset:
    """``size`` samples drawn from ``seed`` (train and held-out splits use different seeds), generated in
    ``num_proc`` processes and cached by `datasets` (keyed by the arguments and this file's source).

    Columns: ``scenes`` int ``[n_images][grid * grid]`` (0 = empty cell, else ``1 + shape * len(COLOURS) +
    colour``), ``render_seed`` int, ``task``, ``question``, ``answer`` str.
    """
    shards = max(1, min(num_proc or 1, size // 1000))
    counts = [size // shards + (shard < size % shards) for shard in range(shards)]
    key = f"{Path(__file__).read_text()}{config}{size}{seed}".encode()
    return datasets.Dataset.from_generator(_generate, gen_kwargs={"config": config, "seed": seed,
                                                                  "shards": list(enumerate(counts))},
                                           num_proc=shards if shards > 1 else None,
                                           fingerprint=hashlib.sha256(key).hexdigest()[:16])


def _generate(config: SceneConfig, seed: int, shards: list[tuple[int, int]]) -> Iterator[dict[str, Any]]:
    """The samples of ``shards`` ((index, count) pairs), each shard from its own random stream."""
    for shard, count in shards:
        rng = np.random.default_rng([seed, shard])
        for _ in range(count):
            yield _sample(config, rng)


def _sample(config: SceneConfig, rng: np.random.Generator) -> dict[str, Any]:
    """One sample: draw a task, then scenes until the task can ask an unambiguous question about them."""
    task = TASKS[rng.integers(len(TASKS))]
    fewest_images = 2 if task == "compare" else 1
    while True:
        n_images = int(rng.integers(fewest_images, config.max_images + 1))
        scenes = np.stack([_scene(config, rng) for _ in range(n_images)])
        asked = QUESTIONS[task](scenes, rng)
        if asked is not None:
            return {"scenes": scenes.reshape(n_images, -1).tolist(), "render_seed": int(rng.integers(2**31)),
                    "task": task, "question": asked[0], "answer": asked[1]}


def _scene(config: SceneConfig, rng: np.random.Generator) -> np.ndarray:
    """int64 ``[grid, grid]`` cell codes with 1..max_objects shapes in distinct cells."""
    cells = np.zeros(config.patches, dtype=np.int64)
    count = rng.integers(1, config.max_objects + 1)
    where = rng.permutation(config.patches)[:count]
    cells[where] = 1 + rng.integers(len(SHAPES), size=count) * len(COLOURS) + rng.integers(len(COLOURS), size=count)
    return cells.reshape(config.grid, config.grid)


# ---------------------------------------------------------------------- questions
# Each takes scenes int [n_images, grid, grid] and returns (question, answer), or None when the scenes
# allow no unambiguous question of its kind.


def _shape(cells: np.ndarray) -> np.ndarray:
    return np.where(cells > 0, (cells - 1) // len(COLOURS), -1)


def _colour(cells: np.ndarray) -> np.ndarray:
    return np.where(cells > 0, (cells - 1) % len(COLOURS), -1)


def _attribute(rng: np.random.Generator) -> tuple[Callable[[np.ndarray], np.ndarray], int, str]:
    """A random attribute to count: (property of cells, value, plural noun phrase)."""
    if rng.random() < 0.5:
        value = int(rng.integers(len(COLOURS)))
        return _colour, value, f"{COLOURS[value]} shapes"
    value = int(rng.integers(len(SHAPES)))
    return _shape, value, f"{SHAPES[value]}s"


def _count(scenes, rng):
    k = int(rng.integers(len(scenes)))
    prop, value, noun = _attribute(rng)
    return f"how many {noun} are in image {NUMBERS[k + 1]} ?", NUMBERS[int((prop(scenes[k]) == value).sum())]


def _unique(values: np.ndarray, rng: np.random.Generator) -> int | None:
    """A random value that occurs exactly once in ``values`` (ignoring -1), or None."""
    found, counts = np.unique(values[values >= 0], return_counts=True)
    once = found[counts == 1]
    return int(rng.choice(once)) if len(once) else None


def _colour_of_shape(scenes, rng):
    k = int(rng.integers(len(scenes)))
    shape = _unique(_shape(scenes[k]), rng)
    if shape is None:
        return None
    colour = _colour(scenes[k])[_shape(scenes[k]) == shape][0]
    return f"what colour is the {SHAPES[shape]} in image {NUMBERS[k + 1]} ?", COLOURS[colour]


def _shape_of_colour(scenes, rng):
    k = int(rng.integers(len(scenes)))
    colour = _unique(_colour(scenes[k]), rng)
    if colour is None:
        return None
    shape = _shape(scenes[k])[_colour(scenes[k]) == colour][0]
    return f"what is the shape of the {COLOURS[colour]} object in image {NUMBERS[k + 1]} ?", SHAPES[shape]


def _position(scenes, rng):
    k = int(rng.integers(len(scenes)))
    found, counts = np.unique(scenes[k][scenes[k] > 0], return_counts=True)
    unique = found[counts == 1]  # objects named unambiguously by "colour shape"
    if len(unique) < 2:
        return None
    a, b = rng.choice(unique, size=2, replace=False)
    where_a, where_b = np.argwhere(scenes[k] == a)[0], np.argwhere(scenes[k] == b)[0]
    relation = list(RELATIONS)[rng.integers(len(RELATIONS))]
    axis, sign = RELATIONS[relation]
    if where_a[axis] == where_b[axis]:
        return None
    holds = np.sign(where_a[axis] - where_b[axis]) == sign
    return (f"is the {_name(a)} {relation} the {_name(b)} in image {NUMBERS[k + 1]} ?", "yes" if holds else "no")


def _name(code: int) -> str:
    return f"{COLOURS[(code - 1) % len(COLOURS)]} {SHAPES[(code - 1) // len(COLOURS)]}"


def _compare(scenes, rng):
    prop, value, noun = _attribute(rng)
    counts = (prop(scenes) == value).sum(axis=(1, 2))
    if (counts == counts.max()).sum() > 1:
        return None
    return f"which image has more {noun} ?", NUMBERS[int(counts.argmax()) + 1]


QUESTIONS = {"count": _count, "colour": _colour_of_shape, "shape": _shape_of_colour, "position": _position,
             "compare": _compare}


# ---------------------------------------------------------------------- rendering and encoding


def render(cells: np.ndarray, config: SceneConfig, rng: np.random.Generator) -> np.ndarray:
    """uint8 ``[3, H, W]`` image of ``cells`` (int ``[grid * grid]``): a noisy dark background and each
    shape with a random size, offset and tint inside its cell. Vectorised over the shapes."""
    grid, cell = config.grid, config.cell
    tiles = rng.integers(20, 45, size=(grid * grid, cell, cell, 3), dtype=np.uint8)
    objects = np.flatnonzero(cells)
    codes = cells[objects] - 1
    radius = cell * rng.uniform(0.28, 0.45, size=(len(objects), 1, 1))
    centre_y, centre_x = rng.uniform(radius, cell - radius, size=(2, len(objects), 1, 1))
    y, x = np.arange(cell)[:, None], np.arange(cell)
    inside = _shape_masks((y + 0.5 - centre_y) / radius, (x + 0.5 - centre_x) / radius)  # [4, n, cell, cell]
    inside = inside[codes // len(COLOURS), np.arange(len(objects))]
    tint = np.clip(RGB[codes % len(COLOURS)] + rng.integers(-25, 26, size=(len(objects), 3)), 0, 255)
    tiles[objects] = np.where(inside[..., None], tint[:, None, None].astype(np.uint8), tiles[objects])
    return tiles.reshape(grid, grid, cell, cell, 3).transpose(4, 0, 2, 1, 3).reshape(3, grid * cell, grid * cell)


def _shape_masks(dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """bool ``[len(SHAPES), *dy.shape]``: which points (offsets in units of the radius) each shape covers."""
    return np.stack([dy**2 + dx**2 <= 1,  # circle
                     np.maximum(abs(dy), abs(dx)) <= 0.8,  # square
                     (dy <= 0.8) & (abs(dx) <= (dy + 1) * 0.55),  # triangle, apex up
                     abs(dy) + abs(dx) <= 1])  # diamond


class SampleEncoder:
    """``Dataset.with_transform`` function: rendered pixels and token ids of a batch of rows.

    Returns per row ``input_ids`` (list of int), ``modality_spans`` ([(start, end)] of each image's
    ``<image>`` tokens), ``prompt_length`` (tokens up to and including ``answer``; the answer and
    ``<eos>`` follow) and ``pixel_values`` (uint8 ``[n_images, 3, H, W]``): what `OmniCollator` and the VLM
    read. ``blank_images=True`` renders every scene empty (the text-only baseline).
    """

    def __init__(self, tokenizer: WordTokenizer, config: SceneConfig, blank_images: bool = False) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.blank_images = blank_images

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rows = [self.encode(*values) for values in zip(batch["scenes"], batch["render_seed"], batch["question"],
                                                       batch["answer"])]
        return {key: [row[key] for row in rows] for key in rows[0]}

    def encode(self, scenes: list[list[int]], render_seed: int, question: str, answer: str) -> dict[str, Any]:
        tok, patches = self.tokenizer, self.config.patches
        ids, spans = [tok.bos_id], []
        for k in range(len(scenes)):
            ids += tok.encode(f"image {NUMBERS[k + 1]}")
            spans.append((len(ids), len(ids) + patches))
            ids += [tok.image_id] * patches
        ids += tok.encode(f"{question} answer")
        prompt_length = len(ids)
        ids += tok.encode(answer) + [tok.eos_id]
        cells = np.zeros_like(scenes) if self.blank_images else np.asarray(scenes)
        rng = np.random.default_rng(render_seed)
        pixels = np.stack([render(c, self.config, rng) for c in cells])
        return {"input_ids": ids, "modality_spans": spans, "prompt_length": prompt_length, "pixel_values": pixels}
