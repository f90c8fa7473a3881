"""`OmniCollator`: interleaved text / image samples -> a padded or packed batch with omni mask inputs.

The collator lays the samples of a batch out in rows (one sample per row, or several packed into a row)
and returns the tensors a Transformers model and the ``"omni"`` attention backend read. Everything is
vectorised numpy over the batch's tokens; Python loops run over samples and rows only, so it is cheap
enough to run in DataLoader workers and the GPU never waits for a mask.

Samples may come straight from a Transformers processor: with `VisionInputs` settings (from
`OmniCollator.from_processor` or `OmniCollator.from_config`) the collator finds the images among the tokens
itself, checks them against the sample's vision inputs, and packs those inputs in the packed order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ..mask import OmniBlockMask
from ..mask.spans import span_group_ids
from ..mask.types import block_size_pair
from .conversations import process_conversation
from .images import find_images
from .vision_inputs import VisionInputs

__all__ = ["OmniCollator"]

MODES = ("pad", "pack")
PADDING_SIDES = ("right", "left")
_SAMPLE_KEYS = frozenset({"input_ids", "labels", "modality_spans", "prompt_length", "attention_mask"})
_PRODUCED_KEYS = frozenset({"position_ids", "omni_doc_ids", "omni_group_ids", "omni_block_mask"})
_UNSUPPORTED_KEYS = ("pixel_values_videos", "video_grid_thw")


class OmniCollator:
    """Collate samples ``{"input_ids", "modality_spans", "labels"?, "prompt_length"?, ...}`` into a batch.

    A sample (a dict; lists, numpy arrays and torch tensors are all accepted):

    - ``input_ids``: 1-D ints >= 0, at least one token (``[1, n]``, a processor's batch of one, is read as ``[n]``).
    - ``modality_spans``: sorted, non-overlapping ``(start, end)`` token ranges (end exclusive, inside the
      sample) whose tokens attend to each other both ways, e.g. the patch tokens of one image; every
      other token is causal text. Required (``[]`` for a text-only sample) unless ``vision`` is given: a
      missing key is an error rather than a silently all-causal sample, because ``transformers.Trainer``
      drops columns its model does not name unless ``TrainingArguments(remove_unused_columns=False)``,
      which this collator needs.
    - ``labels``: optional, same length as ``input_ids`` (default: ``input_ids``; not shifted, the model
      shifts).
    - ``prompt_length``: an int, required with ``train_on_prompt=False`` (then the first ``prompt_length``
      labels become ``label_ignore_index``), optional otherwise.
    - ``attention_mask``: optional, all ones (processors return one); padding inside a sample is an error.
    - any other key (e.g. ``pixel_values`` ``[n_images, C, H, W]``): a per-sample tensor passed through,
      see "Pass-through" below. The keys this collator produces may not appear in a sample.

    Samples from a processor (``vision``, a `VisionInputs`; `from_processor` and `from_config` fill it in):
    ``modality_spans`` is not given (an error if it is): the collator finds the images among the tokens
    (``vision.image_token_ids``, or value 1 of ``vision.image_type_key``), splits the runs into images by
    their token counts (``image_grid_thw`` for Qwen2-VL, ``tokens_per_image``, or an equal share) and checks
    them against the sample's vision inputs (number of images, tokens per image, Qwen2-VL's patch rows).
    Image tokens get no labels. ``vision.image_attention`` decides the spans: each image (``"bidirectional"``,
    Gemma3), the prefix (``"prefix"``, PaliGemma) or none (``"causal"``: the language model attends to images
    as to text, as Qwen2-VL, LLaVA and Idefics3 do). ``vision.token_keys`` (``token_type_ids``,
    ``mm_token_type_ids``) are packed like ``input_ids`` (int64 ``[B, L]``, 0 on padding; 0 for a sample
    without the key) and ``vision.image_keys`` are concatenated in output-sample order along their dim
    (``[1, n, ...]`` values zero-padded to the largest), with no ``<key>_sample_index``. With a ``processor``,
    a sample may also be a raw TRL-style conversation (``messages`` or ``prompt`` / ``completion``, and
    ``images``), which `process_conversation` turns into such a sample (with its ``prompt_length``) first.

    Layout:

    - ``mode="pad"``: one sample per row, in input order, padded on ``padding_side`` to the longest
      sample. ``max_length``, if given, is a limit: a longer sample is an error (never truncated).
    - ``mode="pack"``: samples are packed first-fit decreasing (longest first, ties in input order, each
      into the first row with room) into rows of at most ``max_length`` tokens, never split; rows come in
      the order they were opened, and the samples of a row in input order. ``split_long_text=True`` cuts a
      text-only sample (no spans, no image tokens) longer than ``max_length`` into pieces of ``max_length``
      tokens (the last shorter), each then packed as a sample of its own; any other longer sample is an error.
    - Both modes: the row length is the longest row rounded up to ``pad_to_multiple_of`` (so
      ``pad_to_multiple_of=max_length`` gives a fixed ``[rows, max_length]`` shape in pack mode).
      "Output samples" are the samples (and pieces) in row-major order: row by row, left to right.

    Output (a dict of CPU tensors; Trainer / accelerate move every value to the device, the block mask
    included, through its ``.to``):

    - ``input_ids`` int64 ``[B, L]``, ``pad_token_id`` on padding.
    - ``labels`` int64 ``[B, L]``: the sample's labels, with ``label_ignore_index`` on padding, on tokens
      inside modality spans and image tokens, on the first token of every output sample (nothing in its
      sample predicts it; this keeps the previous packed sample, or left padding, from being trained to
      predict it under the model's shift-by-one loss) and, with ``train_on_prompt=False``, on prompt tokens.
    - ``attention_mask`` int64 ``[B, L]`` (1 = real token), only when the batch has padding.
    - ``position_ids`` int64 ``[B, L]``: ``vision.first_position`` (default 0), 1, ... within each output
      sample; 0 on padding. With ``vision.mrope_merge_size`` (Qwen2-VL, Qwen2.5-VL) ``[4, B, L]``: these text
      positions, then the model's 3-D rotary positions (temporal, height, width; as its ``get_rope_index``
      computes them for the sample alone), the layout Transformers reads for packed Qwen2-VL rows.
    - ``omni_doc_ids`` int32 ``[B, L]``: the output sample within its row, from 0; -1 on padding.
    - ``omni_group_ids`` int32 ``[B, L]``: the span within its row, from 0 along the row (unique within a
      row); -1 on text and padding.
    - ``omni_block_mask`` (``return_block_mask=True``): an `OmniBlockMask` of the token rule, blocks of
      ``block_size`` (64 or 128, or a ``(block_q, block_kv)`` pair), on CPU. It is in pinned memory when
      ``torch.cuda.is_available()`` and the collator runs in the main process; in a DataLoader worker it is
      left unpinned (pinned memory does not survive the trip to the main process), so pass
      ``DataLoader(pin_memory=True)``, which pins it there (Trainer does by default).

    Pass-through: for every other key, with mode ``"pad"`` and every sample holding a value of one
    shape, the values are stacked: ``[B, *shape]``. Otherwise the values of the output samples are
    concatenated along dim 0 in output-sample order (the order their tokens appear in the batch; a
    0-d value counts as one row; an absent, None or empty value as none) and ``<key>_sample_index``
    (int64, one entry per row) says which output sample each row came from. The pieces of a split sample
    carry its values on the first piece. A key no sample has rows for is left out.

    Errors: a ValueError naming the argument or ``samples[i][key]``, the expected and the received value.
    """

    def __init__(
        self,
        pad_token_id: int,
        *,
        mode: str = "pad",
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str = "right",
        return_block_mask: bool = False,
        block_size: int | tuple[int, int] = 128,
        label_ignore_index: int = -100,
        train_on_prompt: bool = True,
        split_long_text: bool = False,
        vision: VisionInputs | None = None,
        processor: Any = None,
    ) -> None:
        _check_choice("mode", mode, MODES)
        _check_choice("padding_side", padding_side, PADDING_SIDES)
        block_size_pair(block_size)  # raises a ValueError naming block_size
        for name, value in (("pad_token_id", pad_token_id), ("label_ignore_index", label_ignore_index)):
            if not isinstance(value, int):
                raise ValueError(f"{name}: expected an int, got {value!r}")
        for name, value in (("max_length", max_length), ("pad_to_multiple_of", pad_to_multiple_of)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: expected a positive int or None, got {value!r}")
        if mode == "pack" and max_length is None:
            raise ValueError("max_length: expected a positive int with mode='pack', got None")
        if split_long_text and mode != "pack":
            raise ValueError(f"split_long_text: expected False with mode={mode!r} (it applies to mode='pack'), "
                             "got True")
        if vision is not None and not isinstance(vision, VisionInputs):
            raise ValueError(f"vision: expected a VisionInputs or None, got {type(vision).__name__}")
        if processor is not None and vision is None:
            raise ValueError("vision: expected a VisionInputs with a processor (OmniCollator.from_processor fills "
                             "both in), got None")
        self.pad_token_id = pad_token_id
        self.mode = mode
        self.max_length = max_length
        self.pad_to_multiple_of = pad_to_multiple_of
        self.padding_side = padding_side
        self.return_block_mask = return_block_mask
        self.block_size = block_size
        self.label_ignore_index = label_ignore_index
        self.train_on_prompt = train_on_prompt
        self.split_long_text = split_long_text
        self.vision = vision
        self.processor = processor

    @classmethod
    def from_processor(cls, processor: Any, *, image_attention: str | None = None, pad_token_id: int | None = None,
                       **kwargs: Any) -> OmniCollator:
        """A collator for the samples ``processor`` (a Transformers processor of a family in
        `omni_hf.data.FAMILIES`) makes, and for raw conversations, which it runs through ``processor``.

        ``image_attention`` overrides the family's (see `VisionInputs`); ``pad_token_id`` defaults to the
        tokenizer's; ``kwargs`` are the other `OmniCollator` arguments.
        """
        vision = VisionInputs.from_processor(processor, image_attention)
        pad = processor.tokenizer.pad_token_id if pad_token_id is None else pad_token_id
        if pad is None:
            raise ValueError("pad_token_id: expected an int (the processor's tokenizer has no pad token; pass "
                             "pad_token_id=...), got None")
        return cls(pad, vision=vision, processor=processor, **kwargs)

    @classmethod
    def from_config(cls, config: Any, *, image_attention: str | None = None, pad_token_id: int | None = None,
                    **kwargs: Any) -> OmniCollator:
        """A collator for processed samples of the model ``config`` describes (its ``model_type`` in
        `omni_hf.data.FAMILIES`).

        ``pad_token_id`` defaults to the config's (its text config's); the other arguments as `from_processor`.
        """
        vision = VisionInputs.from_config(config, image_attention)
        if pad_token_id is None:
            pad_token_id = getattr(config.get_text_config(), "pad_token_id", None)
            pad_token_id = getattr(config, "pad_token_id", None) if pad_token_id is None else pad_token_id
        if pad_token_id is None:
            raise ValueError("pad_token_id: expected an int (the config has no pad_token_id; pass pad_token_id=...), "
                             "got None")
        return cls(pad_token_id, vision=vision, **kwargs)

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate ``samples`` (see the class docstring for the input, the layout and the output)."""
        if not isinstance(samples, Sequence) or len(samples) == 0:
            got = f"an empty {type(samples).__name__}" if isinstance(samples, Sequence) else type(samples).__name__
            raise ValueError(f"samples: expected a non-empty list of dicts, got {got}")
        read = [_read_sample(self._processed(sample, index), index, self.vision, self.train_on_prompt)
                for index, sample in enumerate(samples)]
        _check_spans(read)
        layout = self._layout(read)
        out = self._tokens(read, layout)
        if self.vision is not None:
            out.update(_image_inputs(read, layout, self.vision.image_keys))
        out.update(_pass_through([sample.extras for sample in read], layout, stack=self.mode == "pad"))
        if self.return_block_mask:
            out["omni_block_mask"] = _block_mask(out["omni_doc_ids"], out["omni_group_ids"], self.block_size)
        return out

    def _processed(self, sample: Any, index: int) -> Any:
        """A raw conversation through the processor (see `process_conversation`); any other sample as is."""
        if self.processor is None or not isinstance(sample, Mapping) or "input_ids" in sample:
            return sample
        return process_conversation(self.processor, sample, index)

    def _layout(self, samples: list[_Sample]) -> _Layout:
        """Cut (when asked), place and order the output samples."""
        lengths = np.array([len(sample.input_ids) for sample in samples], dtype=np.int64)
        text_only = np.array([len(sample.spans) == 0 and not sample.image_tokens.any() for sample in samples])
        source, start, length = _output_samples(lengths, text_only, self.max_length, self.split_long_text, self.mode)
        row = (_first_fit_decreasing(length.tolist(), self.max_length) if self.mode == "pack"
               else np.arange(len(length)))
        order = np.argsort(row, kind="stable")  # row-major; input order inside a row
        source, start, length, row = source[order], start[order], length[order], row[order]
        row_end = np.cumsum(np.bincount(row, weights=length).astype(np.int64))
        row_used = np.diff(row_end, prepend=0)
        width = _round_up(int(row_used.max()), self.pad_to_multiple_of or 1)
        row_column = width - row_used if self.padding_side == "left" else np.zeros_like(row_used)
        return _Layout(source, start, length, row, row_end - row_used, row_used, row_column, width)

    def _tokens(self, samples: list[_Sample], layout: _Layout) -> dict[str, torch.Tensor]:
        """The ``[B, L]`` token tensors (``[4, B, L]`` 3-D positions): built as streams in output order, then
        copied row by row."""
        pieces = list(zip(layout.source.tolist(), layout.start.tolist(), layout.length.tolist()))
        counting = np.arange(layout.length.max(), dtype=np.int64)
        positions = np.concatenate([counting[:n] for _, _, n in pieces])  # within each output sample
        group_ids = _group_stream(samples, layout)
        doc_ids = np.arange(len(pieces), dtype=np.int32) - np.searchsorted(layout.row, layout.row).astype(np.int32)
        first = 0 if self.vision is None else self.vision.first_position
        streams = {
            "input_ids": (np.concatenate([samples[s].input_ids[a:a + n] for s, a, n in pieces]), self.pad_token_id),
            "labels": (self._labels(samples, layout, pieces, positions, group_ids), self.label_ignore_index),
            "position_ids": (positions + first, 0),
            "omni_doc_ids": (np.repeat(doc_ids, layout.length), -1),
            "omni_group_ids": (group_ids, -1),
        }
        for key in dict.fromkeys(key for sample in samples for key in sample.token_values):
            streams[key] = (np.concatenate([_token_values(samples[s], key)[a:a + n] for s, a, n in pieces]), 0)
        if (layout.row_used < layout.width).any():
            streams["attention_mask"] = (np.ones(len(positions), dtype=np.int64), 0)
        out = {key: _rows(stream, fill, layout) for key, (stream, fill) in streams.items()}
        if self.vision is not None and self.vision.mrope_merge_size is not None:
            rope = np.concatenate([samples[s].rope[:, a:a + n] - a for s, a, n in pieces], axis=1)
            out["position_ids"] = torch.stack([out["position_ids"], *(_rows(axis, 0, layout) for axis in rope)])
        return out

    def _labels(self, samples: list[_Sample], layout: _Layout, pieces: list[tuple[int, int, int]],
                positions: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
        """int64 label stream: the samples' labels, ignored on span and image tokens, on the first token of
        every output sample and (``train_on_prompt=False``) on prompt tokens."""
        labels = np.concatenate([samples[s].labels[a:a + n] for s, a, n in pieces])
        labels[group_ids >= 0] = self.label_ignore_index
        labels[np.concatenate([samples[s].image_tokens[a:a + n] for s, a, n in pieces])] = self.label_ignore_index
        labels[positions == 0] = self.label_ignore_index
        if not self.train_on_prompt:
            prompt = np.array([samples[s].prompt_length for s, _, _ in pieces], dtype=np.int64)
            left = np.clip(prompt - layout.start, 0, layout.length)  # prompt tokens in each output sample
            labels[positions < np.repeat(left, layout.length)] = self.label_ignore_index
        return labels


class _Sample(NamedTuple):
    """One sample, read and checked (spans are checked for the whole batch by `_check_spans`)."""

    input_ids: np.ndarray  # int64 [n]
    labels: np.ndarray  # int64 [n]
    spans: np.ndarray  # int64 [k, 2]: token ranges that attend both ways
    image_tokens: np.ndarray  # bool [n]: tokens that stand for image features
    rope: np.ndarray | None  # int64 [3, n]: 3-D rotary positions (vision.mrope_merge_size), else None
    prompt_length: int
    token_values: dict[str, np.ndarray]  # vision.token_keys: int64 [n]
    images: dict[str, torch.Tensor]  # vision.image_keys
    extras: dict[str, torch.Tensor]  # the pass-through values


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The ``M`` output samples in output (row-major) order, and the ``B`` rows. int64 arrays."""

    source: np.ndarray  # [M] the input sample each comes from
    start: np.ndarray  # [M] its first token within that input sample (non-zero for later pieces)
    length: np.ndarray  # [M]
    row: np.ndarray  # [M]
    row_begin: np.ndarray  # [B] first token of each row in the output-order token stream
    row_used: np.ndarray  # [B] tokens in each row
    row_column: np.ndarray  # [B] column of each row's first token
    width: int  # L


# ---------------------------------------------------------------------- reading samples


def _read_sample(sample: Mapping[str, Any], index: int, vision: VisionInputs | None,
                 train_on_prompt: bool) -> _Sample:
    """Convert and check one sample's values; with ``vision``, find and check its images. Without
    ``train_on_prompt`` the sample must say where its prompt ends (``prompt_length``)."""
    if not isinstance(sample, Mapping):
        raise ValueError(f"samples[{index}]: expected a dict, got {type(sample).__name__}")
    if "input_ids" not in sample and ("messages" in sample or "prompt" in sample):
        raise ValueError(f"samples[{index}]['input_ids']: expected token ids (a conversation needs a collator with a "
                         "processor: OmniCollator.from_processor), got a conversation without them")
    if sample.get("input_ids") is None:
        raise ValueError(f"samples[{index}]['input_ids']: expected token ids, got no such key (keys: {sorted(sample)})")
    input_ids = _int_vector(sample["input_ids"], index, "input_ids")
    if len(input_ids) == 0:
        raise ValueError(f"samples[{index}]['input_ids']: expected at least one token, got 0")
    if input_ids.min() < 0:
        position = int(np.argmax(input_ids < 0))
        raise ValueError(f"samples[{index}]['input_ids']: expected token ids >= 0, got {int(input_ids[position])} "
                         f"at position {position}")
    labels = (input_ids if sample.get("labels") is None
              else _int_vector(sample["labels"], index, "labels", len(input_ids)))
    if sample.get("attention_mask") is not None:
        mask = torch.as_tensor(sample["attention_mask"]).long()  # bool or int
        _check_no_padding(_int_vector(mask, index, "attention_mask", len(input_ids)), index)
    prompt_length = _prompt_length(sample, len(input_ids), index, required=not train_on_prompt)
    if vision is None:
        no_images = np.zeros(len(input_ids), dtype=bool)
        return _Sample(input_ids, labels, _spans(sample, index), no_images, None, prompt_length, {}, {},
                       _extras(sample, index, frozenset()))
    if "modality_spans" in sample:
        raise ValueError(f"samples[{index}]['modality_spans']: expected no such key (with vision settings the collator "
                         "finds the images itself), got one")
    for key in _UNSUPPORTED_KEYS:
        if sample.get(key) is not None:
            raise ValueError(f"samples[{index}]['{key}']: expected no video inputs (not supported yet), got one")
    token_values = {key: _int_vector(sample[key], index, key, len(input_ids))
                    for key in vision.token_keys if sample.get(key) is not None}
    found = find_images(sample, input_ids, token_values, vision, index)
    return _Sample(input_ids, labels, found.spans, found.image_tokens, found.rope, prompt_length, token_values,
                   found.images, _extras(sample, index, vision.keys))


def _int_vector(value: Any, index: int, key: str, length: int | None = None) -> np.ndarray:
    """A 1-D int64 array from a list, numpy array or tensor of ints (``[1, n]``, a batch of one, read as ``[n]``),
    of ``length`` values when given."""
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1 or (array.size > 0 and array.dtype.kind not in "iu"):
        raise ValueError(f"samples[{index}]['{key}']: expected a 1-D sequence of ints (or [1, n], a processor's batch "
                         f"of one), got {_describe(array)}")
    if length is not None and len(array) != length:
        raise ValueError(f"samples[{index}]['{key}']: expected {length} values (the length of input_ids), "
                         f"got {len(array)}")
    return array.astype(np.int64, copy=False)


def _check_no_padding(attention_mask: np.ndarray, index: int) -> None:
    if not (attention_mask == 1).all():
        raise ValueError(f"samples[{index}]['attention_mask']: expected all ones (the collator pads; a sample holds "
                         f"no padding), got {int((attention_mask != 1).sum())} zeros")


def _spans(sample: Mapping[str, Any], index: int) -> np.ndarray:
    """The sample's spans as int64 ``[k, 2]``."""
    where = f"samples[{index}]['modality_spans']"
    if "modality_spans" not in sample:
        raise ValueError(f"{where}: expected a list of (start, end) token ranges ([] for a text-only sample), got "
                         "no such key (with transformers.Trainer, set TrainingArguments(remove_unused_columns="
                         "False): it drops the columns the model's forward does not name; for a processor's samples, "
                         "use OmniCollator.from_processor or from_config, which find the images themselves)")
    value = sample["modality_spans"]
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.size == 0:
        return np.empty((0, 2), dtype=np.int64)
    if array.ndim != 2 or array.shape[1] != 2 or array.dtype.kind not in "iu":
        raise ValueError(f"{where}: expected (start, end) pairs of ints, shape [k, 2], got {_describe(array)}")
    return array.astype(np.int64, copy=False)


def _prompt_length(sample: Mapping[str, Any], length: int, index: int, required: bool) -> int:
    """The sample's ``prompt_length`` (0 when absent and not ``required``)."""
    value = sample.get("prompt_length")
    if value is None and required:
        raise ValueError(f"samples[{index}]['prompt_length']: expected an int in [0, {length}] with "
                         "train_on_prompt=False (the prompt tokens whose labels are ignored; 0 trains on the whole "
                         f"sample), got {'None' if 'prompt_length' in sample else 'no such key'}")
    if value is None:
        return 0
    number = value.item() if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0 else value
    if isinstance(number, bool) or not isinstance(number, (int, np.integer)) or not 0 <= number <= length:
        raise ValueError(f"samples[{index}]['prompt_length']: expected an int in [0, {length}] (the sample's "
                         f"length), got {value!r}")
    return int(number)


def _extras(sample: Mapping[str, Any], index: int, read: frozenset[str]) -> dict[str, torch.Tensor]:
    """The sample's pass-through values as tensors (None values, and the keys in ``read``, dropped)."""
    extras = {}
    for key, value in sample.items():
        if key in _SAMPLE_KEYS or key in read or value is None:
            continue
        if key in _PRODUCED_KEYS:
            raise ValueError(f"samples[{index}]['{key}']: expected no such key (the collator produces '{key}'; "
                             "remove it from the samples), got one")
        try:
            extras[key] = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"samples[{index}]['{key}']: expected a tensor, array or number to pass through, "
                             f"got {type(value).__name__} ({error})") from None
    return extras


def _check_spans(samples: list[_Sample]) -> None:
    """Every span must be non-empty and inside its sample, and a sample's spans sorted and disjoint.

    Checked for the whole batch at once; the error names the first sample at fault.
    """
    counts = [len(sample.spans) for sample in samples]
    spans = np.concatenate([sample.spans for sample in samples])
    owner = np.repeat(np.arange(len(samples)), counts)
    lengths = np.array([len(sample.input_ids) for sample in samples], dtype=np.int64)
    start, end = spans[:, 0], spans[:, 1]
    outside = (start < 0) | (end > lengths[owner]) | (end <= start)
    overlapping = np.zeros(len(spans), dtype=bool)
    overlapping[1:] = (owner[1:] == owner[:-1]) & (start[1:] < end[:-1])
    for bad, expected in ((outside, "ranges with 0 <= start < end <= {n} (the sample's length)"),
                          (overlapping, "sorted, non-overlapping ranges")):
        if bad.any():
            index = int(owner[np.argmax(bad)])
            raise ValueError(f"samples[{index}]['modality_spans']: expected {expected.format(n=lengths[index])}, "
                             f"got {samples[index].spans.tolist()}")


def _token_values(sample: _Sample, key: str) -> np.ndarray:
    """The sample's per-token ``key``, zeros when it has none."""
    value = sample.token_values.get(key)
    return np.zeros(len(sample.input_ids), dtype=np.int64) if value is None else value


# ---------------------------------------------------------------------- layout


def _output_samples(lengths: np.ndarray, text_only: np.ndarray, max_length: int | None, split: bool,
                    mode: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output samples in input order: source sample, first token in it and length, int64 ``[M]``.

    Every sample is whole, except (``split``) text-only samples longer than ``max_length``, which become
    pieces of ``max_length`` tokens; any other sample longer than ``max_length`` is an error.
    """
    if max_length is None:
        return np.arange(len(lengths)), np.zeros_like(lengths), lengths
    too_long = lengths > max_length
    splittable = too_long & text_only & split
    if (too_long & ~splittable).any():
        index = int(np.argmax(too_long & ~splittable))
        hint = ("it has modality spans or image tokens, which are never split" if split else
                "split_long_text=True splits text-only samples" if mode == "pack" else "samples are never truncated")
        raise ValueError(f"samples[{index}]['input_ids']: expected at most max_length={max_length} tokens "
                         f"(mode={mode!r}; {hint}), got {lengths[index]}")
    pieces = np.where(splittable, -(-lengths // max_length), 1)
    source = np.repeat(np.arange(len(lengths)), pieces)
    start = (np.arange(len(source)) - np.repeat(np.cumsum(pieces) - pieces, pieces)) * max_length
    return source, start, np.minimum(lengths[source] - start, max_length)


def _first_fit_decreasing(lengths: list[int], capacity: int) -> np.ndarray:
    """int64 row of each sample: longest first (ties in input order), each into the first row with room."""
    free: list[int] = []
    row = np.empty(len(lengths), dtype=np.int64)
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        target = next((r for r, room in enumerate(free) if room >= lengths[index]), len(free))
        if target == len(free):
            free.append(capacity)
        free[target] -= lengths[index]
        row[index] = target
    return row


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# ---------------------------------------------------------------------- token streams


def _group_stream(samples: list[_Sample], layout: _Layout) -> np.ndarray:
    """int32 group id of every token of the output-order stream: spans numbered from 0 along each row,
    -1 on text (`omni_hf.mask.spans.span_group_ids`, the numbering of `token_ids_from_spans`)."""
    spans = [samples[s].spans for s in layout.source.tolist()]  # a split sample has none to shift
    counts = np.array([len(x) for x in spans], dtype=np.int64)
    begins = np.cumsum(layout.length) - layout.length  # first token of each output sample in the stream
    in_stream = np.concatenate(spans) + np.repeat(begins, counts)[:, None]
    return span_group_ids(in_stream, np.repeat(layout.row, counts), int(layout.length.sum()))


def _rows(stream: np.ndarray, fill: int, layout: _Layout) -> torch.Tensor:
    """``[B, L]`` tensor of ``stream``'s dtype: each row's slice of the stream at its column, ``fill`` elsewhere."""
    out = np.full((len(layout.row_used), layout.width), fill, dtype=stream.dtype)
    for row, (begin, used, column) in enumerate(zip(layout.row_begin.tolist(), layout.row_used.tolist(),
                                                    layout.row_column.tolist())):
        out[row, column:column + used] = stream[begin:begin + used]
    return torch.from_numpy(out)


def _pass_through(extras: list[dict[str, torch.Tensor]], layout: _Layout, stack: bool) -> dict[str, torch.Tensor]:
    """The other keys' values by the pass-through rule of `OmniCollator` (stacked, or concatenated with
    ``<key>_sample_index``)."""
    carriers = np.flatnonzero(layout.start == 0).tolist()  # output samples carrying their input sample's values
    out = {}
    for key in dict.fromkeys(key for sample in extras for key in sample):
        values = [extras[layout.source[k]].get(key) for k in carriers]
        if stack and all(v is not None for v in values) and len({v.shape for v in values}) == 1:
            out[key] = torch.stack(values)
            continue
        rows = [(k, torch.atleast_1d(v)) for k, v in zip(carriers, values) if v is not None and v.numel() > 0]
        if not rows:
            continue
        _check_trailing_shapes(key, rows, layout.source)
        out[key] = torch.cat([v for _, v in rows])
        out[f"{key}_sample_index"] = torch.repeat_interleave(
            torch.tensor([k for k, _ in rows], dtype=torch.int64), torch.tensor([len(v) for _, v in rows]))
    return out


def _image_inputs(samples: list[_Sample], layout: _Layout, image_keys: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """The vision inputs of the output samples, concatenated in output-sample order along each key's dim; a
    ``[1, n, ...]`` key's values zero-padded to the largest (dims after the second), as the processor pads."""
    carriers = layout.source[layout.start == 0].tolist()  # a split sample's first piece carries its values
    out = {}
    for key, dim in image_keys.items():
        rows = [(k, samples[k].images[key]) for k in carriers if key in samples[k].images]
        if not rows:
            continue
        if dim == 1:
            rows = _zero_padded(key, rows)
        else:
            _check_trailing_shapes(key, rows, np.arange(len(samples)))
        out[key] = torch.cat([value for _, value in rows], dim=dim)
    return out


def _zero_padded(key: str, rows: list[tuple[int, torch.Tensor]]) -> list[tuple[int, torch.Tensor]]:
    """``[1, n, ...]`` values padded with zeros after the end of every dim past the second to the largest size."""
    if len({value.ndim for _, value in rows}) > 1:
        index, value = next((k, v) for k, v in rows if v.ndim != rows[0][1].ndim)
        raise ValueError(f"samples[{index}]['{key}']: expected {rows[0][1].ndim} dims (as the other samples), got "
                         f"{list(value.shape)}")
    largest = torch.tensor([list(value.shape[2:]) for _, value in rows]).amax(0).tolist()
    padded = []
    for index, value in rows:
        widths = [w for size, target in zip(reversed(value.shape[2:]), reversed(largest)) for w in (0, target - size)]
        padded.append((index, torch.nn.functional.pad(value, widths)))
    return padded


def _check_trailing_shapes(key: str, rows: list[tuple[int, torch.Tensor]], source: np.ndarray) -> None:
    """Values concatenated along dim 0 must agree on every other dim."""
    expected = rows[0][1].shape[1:]
    for k, value in rows:
        if value.shape[1:] != expected:
            raise ValueError(f"samples[{source[k]}]['{key}']: expected shape [n, {', '.join(map(str, expected))}] "
                             f"(as the other samples, to concatenate), got {list(value.shape)}")


def _block_mask(doc_ids: torch.Tensor, group_ids: torch.Tensor, block_size: int | tuple[int, int]) -> OmniBlockMask:
    """The token-rule mask on CPU; pinned when CUDA is available, except in a DataLoader worker (see
    `OmniCollator`)."""
    mask = OmniBlockMask.from_token_ids(doc_ids, group_ids, block_size=block_size)
    if torch.cuda.is_available() and get_worker_info() is None:
        mask = mask.pin_memory()
    return mask


def _check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")


def _describe(array: np.ndarray) -> str:
    return f"dtype {array.dtype} and shape {list(array.shape)}"
