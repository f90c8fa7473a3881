"""OmniCollator: layout, token fields and mask checked against definitions written from the samples.

Every sample's token ids encode (sample, position): ``1 + 1000 * sample + position``, and padding is 0,
so a test reads back where each token went from ``input_ids`` alone and derives the expected mask,
labels, positions and ids from the samples themselves, never from the collator's own arithmetic.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omni_hf.data.collator as collator_module
from omni_hf.data import OmniCollator
from omni_hf.mask import OmniBlockMask

PAD = 0
IGNORE = -100
LABEL_OFFSET = 500_000


def token(sample: int, position: int) -> int:
    return 1 + 1000 * sample + position


def make_sample(index: int, length: int, spans=(), **extra) -> dict:
    return {"input_ids": [token(index, t) for t in range(length)], "modality_spans": list(spans), **extra}


# ---------------------------------------------------------------------- the definitions


@dataclasses.dataclass(frozen=True)
class Cell:
    """A real token of the output: the input sample, its position there, and the output sample it is in
    (``piece``: which ``max_length`` piece of a split sample, else 0)."""

    sample: int
    position: int
    piece: int


def decode(batch: dict, samples: list[dict], split_length: int | None) -> list[list[Cell | None]]:
    """Where each input token landed, read from ``input_ids`` alone (None = padding)."""
    rows = []
    for row in batch["input_ids"].tolist():
        cells = []
        for value in row:
            if value == PAD:
                cells.append(None)
                continue
            sample, position = divmod(value - 1, 1000)
            piece = position // split_length if is_split(samples[sample], split_length) else 0
            cells.append(Cell(sample, position, piece))
        rows.append(cells)
    return rows


def is_split(sample: dict, split_length: int | None) -> bool:
    return split_length is not None and not sample["modality_spans"] and len(sample["input_ids"]) > split_length


def span_index(sample: dict, position: int) -> int | None:
    return next((k for k, (a, b) in enumerate(sample["modality_spans"]) if a <= position < b), None)


def piece_start(cell: Cell, split_length: int | None) -> int:
    return cell.piece * split_length if cell.piece else 0


def expected_mask(cells: list[list[Cell | None]], samples: list[dict]) -> np.ndarray:
    """bool [B, L, L]: same output sample, and the key at or before the query in that sample or in the
    same span (image) of it; padding neither sees nor is seen."""
    out = []
    for row in cells:
        owner = np.array([-1 if c is None else 1000 * c.sample + c.piece for c in row])
        position = np.array([-1 if c is None else c.position for c in row])
        span = np.array([-1 if c is None or span_index(samples[c.sample], c.position) is None
                         else span_index(samples[c.sample], c.position) for c in row])
        q, k = np.s_[:, None], np.s_[None, :]
        same_sample = (owner[q] >= 0) & (owner[q] == owner[k])
        out.append(same_sample & ((position[k] <= position[q]) | ((span[q] >= 0) & (span[q] == span[k]))))
    return np.stack(out)


def expected_label(cell: Cell, sample: dict, split_length: int | None, train_on_prompt: bool) -> int:
    if cell.position == piece_start(cell, split_length) or span_index(sample, cell.position) is not None:
        return IGNORE
    if not train_on_prompt and cell.position < sample.get("prompt_length", 0):
        return IGNORE
    source = sample["labels"] if "labels" in sample else sample["input_ids"]
    return int(source[cell.position])


def output_samples(row: list[Cell | None]) -> list[tuple[int, int]]:
    """The (sample, piece) keys of a row, left to right."""
    return list(dict.fromkeys((c.sample, c.piece) for c in row if c is not None))


def row_spans(row: list[Cell | None], samples: list[dict]) -> list[tuple[int, int, int]]:
    """The (sample, piece, span) keys of a row's image tokens, left to right."""
    keys = [(c.sample, c.piece, span_index(samples[c.sample], c.position)) for c in row if c is not None]
    return list(dict.fromkeys(k for k in keys if k[2] is not None))


# ---------------------------------------------------------------------- random batches


@st.composite
def samples_strategy(draw, max_samples: int = 6, max_length: int = 90) -> list[dict]:
    """1-6 samples with random lengths, spans (adjacent allowed), labels and prompt lengths, their ids
    as lists, numpy arrays or tensors."""
    convert = draw(st.sampled_from([list, np.array, torch.tensor]))
    samples = []
    for index in range(draw(st.integers(1, max_samples))):
        length = draw(st.integers(1, max_length))
        spans, cursor = [], 0
        for gap, size in draw(st.lists(st.tuples(st.integers(0, 12), st.integers(1, 30)), max_size=4)):
            if cursor + gap + size > length:
                break
            spans.append((cursor + gap, cursor + gap + size))
            cursor += gap + size
        sample = make_sample(index, length, spans)
        if draw(st.booleans()):
            sample["labels"] = [LABEL_OFFSET + x if draw(st.booleans()) else IGNORE for x in sample["input_ids"]]
        if draw(st.booleans()):
            sample["prompt_length"] = draw(st.integers(0, length))
        samples.append(sample)
    return [{k: convert(v) if k in ("input_ids", "labels") else v for k, v in s.items()} for s in samples]


@st.composite
def batches(draw) -> tuple[list[dict], dict]:
    """Samples and collator options, both modes and padding sides; pack mode may split long text."""
    samples = draw(samples_strategy())
    options = {"mode": draw(st.sampled_from(["pad", "pack"])),
               "padding_side": draw(st.sampled_from(["right", "left"])),
               "pad_to_multiple_of": draw(st.sampled_from([None, 8, 64])),
               # train_on_prompt=False needs every sample's prompt_length
               "train_on_prompt": draw(st.booleans()) or any("prompt_length" not in s for s in samples)}
    if options["mode"] == "pack":
        lengths = [len(s["input_ids"]) for s in samples]
        with_spans = [n for n, s in zip(lengths, samples) if len(s["modality_spans"])]
        options["split_long_text"] = draw(st.booleans())
        floor = max(with_spans, default=1) if options["split_long_text"] else max(lengths)
        options["max_length"] = draw(st.integers(floor, floor + 150))
    return samples, options


def split_length(options: dict) -> int | None:
    return options["max_length"] if options.get("split_long_text") else None


HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------- properties


@HYPOTHESIS
@given(batches())
def test_mask_equals_brute_force_definition_from_samples(batch_and_options):
    samples, options = batch_and_options
    batch = OmniCollator(PAD, return_block_mask=True, block_size=64, **options)(samples)
    expected = expected_mask(decode(batch, samples, split_length(options)), samples)
    mask = batch["omni_block_mask"]  # OmniBlockMask.from_token_ids of the batch's ids
    assert torch.equal(mask.token_rule.doc_ids, batch["omni_doc_ids"]) and torch.equal(mask.token_rule.group_ids,
                                                                                        batch["omni_group_ids"])
    assert (mask.block_q, mask.block_kv) == (64, 64)
    assert np.array_equal(mask.to_dense()[:, 0].numpy(), expected)


@HYPOTHESIS
@given(batches())
def test_token_fields_follow_their_definitions(batch_and_options):
    samples, options = batch_and_options
    batch = OmniCollator(PAD, **options)(samples)
    cut = split_length(options)
    cells = decode(batch, samples, cut)
    rows, width = batch["input_ids"].shape
    used = [sum(c is not None for c in row) for row in cells]
    multiple = options["pad_to_multiple_of"] or 1
    assert width == -(-max(used) // multiple) * multiple

    # every token of every sample exactly once, each output sample contiguous, in order, in one row
    found = [(c.sample, c.position) for row in cells for c in row if c is not None]
    assert sorted(found) == [(s, t) for s, sample in enumerate(samples) for t in range(len(sample["input_ids"]))]
    for row, n in zip(cells, used):
        content = row[:n] if options["padding_side"] == "right" else row[width - n:]
        assert all(c is not None for c in content), "padding only on the padding side"
        assert [(c.sample, c.position) for c in content] == sorted((c.sample, c.position) for c in content)
    if options["mode"] == "pad":
        assert [output_samples(row) for row in cells] == [[(s, 0)] for s in range(len(samples))]
    else:
        assert max(used) <= options["max_length"]

    for r, row in enumerate(cells):
        keys, spans = output_samples(row), row_spans(row, samples)
        for col, cell in enumerate(row):
            if cell is None:
                assert batch["labels"][r, col] == IGNORE and batch["position_ids"][r, col] == 0
                assert batch["omni_doc_ids"][r, col] == -1 and batch["omni_group_ids"][r, col] == -1
                continue
            sample = samples[cell.sample]
            assert batch["labels"][r, col] == expected_label(cell, sample, cut, options["train_on_prompt"])
            assert batch["position_ids"][r, col] == cell.position - piece_start(cell, cut)
            assert batch["omni_doc_ids"][r, col] == keys.index((cell.sample, cell.piece))
            span = span_index(sample, cell.position)
            group = -1 if span is None else spans.index((cell.sample, cell.piece, span))
            assert batch["omni_group_ids"][r, col] == group

    real = torch.tensor([[c is not None for c in row] for row in cells])
    if bool(real.all()):
        assert "attention_mask" not in batch
    else:
        assert torch.equal(batch["attention_mask"], real.long())
    for key in ("input_ids", "labels", "position_ids", "attention_mask"):
        assert key not in batch or batch[key].dtype == torch.int64
    assert batch["omni_doc_ids"].dtype == batch["omni_group_ids"].dtype == torch.int32


# ---------------------------------------------------------------------- worked examples


def test_pack_is_first_fit_decreasing_with_input_order_inside_rows():
    # lengths 2, 6, 3, 5 into rows of 8. Longest first: 6 -> row 0 (2 left), 5 -> row 1 (3 left),
    # 3 -> row 1 (0 left), 2 -> row 0 (0 left). Row 0 = samples 0, 1; row 1 = samples 2, 3.
    samples = [make_sample(i, n) for i, n in enumerate([2, 6, 3, 5])]
    batch = OmniCollator(PAD, mode="pack", max_length=8)(samples)
    assert batch["input_ids"].tolist() == [
        [token(0, 0), token(0, 1)] + [token(1, t) for t in range(6)],
        [token(2, t) for t in range(3)] + [token(3, t) for t in range(5)],
    ]
    assert "attention_mask" not in batch
    assert batch["omni_doc_ids"].tolist() == [[0, 0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]]


def test_pack_ties_keep_input_order_and_rows_open_in_order():
    samples = [make_sample(i, 3) for i in range(3)]
    batch = OmniCollator(PAD, mode="pack", max_length=6)(samples)
    assert batch["input_ids"][:, 0].tolist() == [token(0, 0), token(2, 0)]
    assert batch["input_ids"][0, 3].item() == token(1, 0)
    assert batch["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]


def test_split_long_text_cuts_pieces_that_restart_positions_and_mask_the_prompt_across_pieces():
    samples = [make_sample(0, 10, prompt_length=6), make_sample(1, 2, [(0, 2)], prompt_length=0)]
    batch = OmniCollator(PAD, mode="pack", max_length=4, split_long_text=True, train_on_prompt=False)(samples)
    # pieces of sample 0: tokens 0-3, 4-7, 8-9; longest first: 4 -> row 0, 4 -> row 1, 2 (piece) -> row 2,
    # sample 1 (2 tokens) -> row 2 after the piece (input order)
    assert batch["input_ids"].tolist() == [[token(0, t) for t in range(4)], [token(0, t) for t in range(4, 8)],
                                           [token(0, 8), token(0, 9), token(1, 0), token(1, 1)]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 0, 1]]
    assert batch["omni_doc_ids"].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]]
    assert batch["omni_group_ids"].tolist() == [[-1] * 4, [-1] * 4, [-1, -1, 0, 0]]
    # prompt = tokens 0-5: all of piece 0, the first two of piece 1; every piece's first token too
    assert batch["labels"].tolist() == [[IGNORE] * 4, [IGNORE, IGNORE, token(0, 6), token(0, 7)],
                                        [IGNORE, token(0, 9), IGNORE, IGNORE]]


def test_left_padding_puts_samples_at_the_end_of_rows_with_positions_from_zero():
    samples = [make_sample(0, 3, [(1, 3)]), make_sample(1, 1)]
    batch = OmniCollator(PAD, padding_side="left", pad_to_multiple_of=4)(samples)
    assert batch["input_ids"].tolist() == [[PAD, token(0, 0), token(0, 1), token(0, 2)], [PAD, PAD, PAD, token(1, 0)]]
    assert batch["position_ids"].tolist() == [[0, 0, 1, 2], [0, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert batch["omni_group_ids"].tolist() == [[-1, -1, 0, 0], [-1, -1, -1, -1]]
    assert batch["labels"].tolist() == [[IGNORE] * 4] * 2


def test_no_attention_mask_when_nothing_is_padded():
    batch = OmniCollator(PAD)([make_sample(0, 5), make_sample(1, 5)])
    assert "attention_mask" not in batch
    assert batch["input_ids"].shape == (2, 5)


# ---------------------------------------------------------------------- pass-through


def test_pass_through_is_stacked_in_pad_mode_when_shapes_agree():
    images = [torch.full((2, 3), float(i)) for i in range(3)]
    batch = OmniCollator(PAD)([make_sample(i, 4, pixel_values=images[i]) for i in range(3)])
    assert torch.equal(batch["pixel_values"], torch.stack(images))
    assert "pixel_values_sample_index" not in batch


def test_pass_through_is_concatenated_in_output_order_with_a_sample_index():
    # pack rows as in the first-fit-decreasing example: output order is samples 0, 1, 2, 3;
    # sample 2 has no images (None), sample 3 none at all (absent)
    def images(i, n):
        return torch.full((n, 2), float(i))

    samples = [make_sample(0, 2, [(0, 1)], pixel_values=images(0, 1)),
               make_sample(1, 6, [(0, 2), (2, 4)], pixel_values=images(1, 2)),
               make_sample(2, 3, pixel_values=None), make_sample(3, 5)]
    packed = OmniCollator(PAD, mode="pack", max_length=8)(samples)
    assert torch.equal(packed["pixel_values"], torch.cat([images(0, 1), images(1, 2)]))
    assert packed["pixel_values_sample_index"].tolist() == [0, 1, 1]

    # reversed input, lengths 5, 3, 6, 2. Longest first: input 2 (6) -> row 0, input 0 (5) -> row 1,
    # input 1 (3) -> row 1, input 3 (2) -> row 0. Output order: inputs 2, 3 | 0, 1 = samples 1, 0, 3, 2
    reordered = [samples[3], samples[2], samples[1], samples[0]]
    packed = OmniCollator(PAD, mode="pack", max_length=8)(reordered)
    assert packed["input_ids"][:, 0].tolist() == [token(1, 0), token(3, 0)]
    assert torch.equal(packed["pixel_values"], torch.cat([images(1, 2), images(0, 1)]))
    assert packed["pixel_values_sample_index"].tolist() == [0, 0, 1]

    padded = OmniCollator(PAD)(samples)  # shapes differ: concatenated in pad mode too
    assert packed["pixel_values"].dtype == padded["pixel_values"].dtype == torch.float32
    assert padded["pixel_values_sample_index"].tolist() == [0, 1, 1]


def test_pass_through_rows_of_a_split_sample_stay_with_its_first_piece():
    samples = [make_sample(0, 3, [(0, 2)], image_sizes=[[7, 7]]), make_sample(1, 9, image_sizes=torch.zeros(0, 2))]
    batch = OmniCollator(PAD, mode="pack", max_length=4, split_long_text=True)(samples)
    # pieces 1/0-3, 1/4-7 (rows 0, 1), sample 0 (3) -> row 2, piece 1/8 -> row 2 after it
    assert batch["input_ids"][2].tolist() == [token(0, 0), token(0, 1), token(0, 2), token(1, 8)]
    assert batch["image_sizes"].tolist() == [[7, 7]]
    assert batch["image_sizes_sample_index"].tolist() == [2]


def test_scalar_pass_through_counts_as_one_row():
    samples = [make_sample(0, 2, sample_id=10), make_sample(1, 4, sample_id=11)]
    assert OmniCollator(PAD)(samples)["sample_id"].tolist() == [10, 11]
    packed = OmniCollator(PAD, mode="pack", max_length=4)(samples)
    assert packed["sample_id"].tolist() == [11, 10]
    assert packed["sample_id_sample_index"].tolist() == [0, 1]


# ---------------------------------------------------------------------- block mask placement


def test_block_mask_is_pinned_only_in_the_main_process_when_cuda_is_available(monkeypatch):
    pinned = []
    monkeypatch.setattr(OmniBlockMask, "pin_memory", lambda self: pinned.append(self) or self)
    collate = OmniCollator(PAD, return_block_mask=True)
    samples = [make_sample(0, 3)]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    collate(samples)
    assert pinned == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(collator_module, "get_worker_info", lambda: object())
    collate(samples)
    assert pinned == []
    monkeypatch.setattr(collator_module, "get_worker_info", lambda: None)
    mask = collate(samples)["omni_block_mask"]
    assert pinned == [mask]
    assert mask.device.type == "cpu"


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize("options, match", [
    ({"mode": "stack"}, r"mode: expected one of \('pad', 'pack'\), got 'stack'"),
    ({"padding_side": "top"}, r"padding_side: expected one of \('right', 'left'\), got 'top'"),
    ({"mode": "pack"}, r"max_length: expected a positive int with mode='pack', got None"),
    ({"max_length": 0}, r"max_length: expected a positive int or None, got 0"),
    ({"pad_to_multiple_of": -8}, r"pad_to_multiple_of: expected a positive int or None, got -8"),
    ({"block_size": 100}, r"block_size: expected one of \(64, 128\) or a \(block_q, block_kv\) pair of them, got 100"),
    ({"split_long_text": True}, r"split_long_text: expected False with mode='pad'"),
])
def test_bad_options_raise_naming_the_argument(options, match):
    with pytest.raises(ValueError, match=match):
        OmniCollator(PAD, **options)


@pytest.mark.parametrize("sample, match", [
    (make_sample(0, 4, [(2, 5)]), r"samples\[1\]\['modality_spans'\]: expected ranges with 0 <= start < end <= 4 "
                                  r".*got \[\[2, 5\]\]"),
    (make_sample(0, 4, [(-1, 2)]), r"samples\[1\]\['modality_spans'\]: expected ranges .*got \[\[-1, 2\]\]"),
    (make_sample(0, 4, [(2, 2)]), r"samples\[1\]\['modality_spans'\]: expected ranges .*got \[\[2, 2\]\]"),
    (make_sample(0, 6, [(0, 3), (2, 4)]), r"samples\[1\]\['modality_spans'\]: expected sorted, non-overlapping "
                                          r"ranges, got \[\[0, 3\], \[2, 4\]\]"),
    (make_sample(0, 6, [(3, 4), (0, 2)]), r"samples\[1\]\['modality_spans'\]: expected sorted, non-overlapping"),
    (make_sample(0, 6, [(0, 1, 2)]), r"samples\[1\]\['modality_spans'\]: expected \(start, end\) pairs of ints, "
                                     r"shape \[k, 2\], got dtype int64 and shape \[1, 3\]"),
    ({"input_ids": [1, 2]}, r"samples\[1\]\['modality_spans'\]: .*got no such key .*remove_unused_columns=False"),
    (make_sample(0, 3, labels=[1, 2]), r"samples\[1\]\['labels'\]: expected 3 values \(the length of input_ids\), "
                                       r"got 2"),
    (make_sample(0, 0), r"samples\[1\]\['input_ids'\]: expected at least one token, got 0"),
    (make_sample(0, 2) | {"input_ids": [[1, 2], [3, 4]]}, r"samples\[1\]\['input_ids'\]: expected a 1-D sequence of "
                                                          r"ints \(or \[1, n\].*got dtype int64 and shape \[2, 2\]"),
    (make_sample(0, 3, prompt_length=4), r"samples\[1\]\['prompt_length'\]: expected an int in \[0, 3\] .*got 4"),
    (make_sample(0, 3, attention_mask=[1, 0, 1]), r"samples\[1\]\['attention_mask'\]: expected all ones .*got 1 "
                                                  r"zeros"),
    (make_sample(0, 3, position_ids=[0, 1, 2]), r"samples\[1\]\['position_ids'\]: expected no such key"),
    (make_sample(0, 3, text="hello"), r"samples\[1\]\['text'\]: expected a tensor, array or number"),
    ("not a dict", r"samples\[1\]: expected a dict, got str"),
])
def test_bad_sample_raises_naming_the_sample(sample, match):
    with pytest.raises(ValueError, match=match):
        OmniCollator(PAD)([make_sample(0, 2), sample])


def test_sample_longer_than_max_length_raises_unless_split_long_text_applies():
    long_text, long_image = make_sample(0, 9), make_sample(1, 9, [(0, 4)])
    with pytest.raises(ValueError, match=r"samples\[0\]\['input_ids'\]: expected at most max_length=8 tokens "
                                         r"\(mode='pack'; split_long_text=True splits text-only samples\), got 9"):
        OmniCollator(PAD, mode="pack", max_length=8)([long_text])
    with pytest.raises(ValueError, match=r"samples\[1\]\['input_ids'\]: .*it has modality spans or image tokens, "
                                         r"which are never split\), got 9"):
        OmniCollator(PAD, mode="pack", max_length=8, split_long_text=True)([long_text, long_image])
    with pytest.raises(ValueError, match=r"samples\[0\].*\(mode='pad'; samples are never truncated\), got 9"):
        OmniCollator(PAD, max_length=8)([long_text])


def test_empty_batch_raises():
    with pytest.raises(ValueError, match=r"samples: expected a non-empty list of dicts, got an empty list"):
        OmniCollator(PAD)([])


def test_pass_through_values_that_cannot_be_concatenated_raise():
    samples = [make_sample(0, 2, pixel_values=torch.zeros(1, 3)), make_sample(1, 3, pixel_values=torch.zeros(1, 4))]
    with pytest.raises(ValueError, match=r"samples\[1\]\['pixel_values'\]: expected shape \[n, 3\] .*got \[1, 4\]"):
        OmniCollator(PAD)(samples)


# ---------------------------------------------------------------------- DataLoader, datasets, Trainer


def assert_batches_equal(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, OmniBlockMask):
            assert torch.equal(got[key].to_dense(), value.to_dense())
            assert torch.equal(got[key].kv.indices, value.kv.indices)
        else:
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def image_samples(count: int) -> list[dict]:
    """Samples of 5-40 tokens with 0-2 images of 4 tokens and matching pixel_values [n_images, 3, 2, 2]."""
    rng = np.random.default_rng(0)
    samples = []
    for index in range(count):
        images = int(rng.integers(0, 3))
        length = int(rng.integers(5 + 5 * images, 40))
        spans = [(1 + 5 * k, 5 + 5 * k) for k in range(images)]
        pixels = rng.standard_normal((images, 3, 2, 2)).astype(np.float32)
        samples.append(make_sample(index, length, spans, pixel_values=pixels, prompt_length=int(rng.integers(0, 5))))
    return samples


def test_dataloader_with_two_workers_returns_the_batches_of_the_main_process():
    samples = image_samples(12)
    collate = OmniCollator(PAD, mode="pack", max_length=64, return_block_mask=True, block_size=64)
    loader = torch.utils.data.DataLoader(samples, batch_size=4, num_workers=2, collate_fn=collate)
    batches = list(loader)
    assert len(batches) == 3
    for number, batch in enumerate(batches):
        assert_batches_equal(batch, collate(samples[4 * number:4 * number + 4]))


def test_datasets_map_with_torch_format_collates_like_the_python_samples():
    datasets = pytest.importorskip("datasets")
    samples = image_samples(8)
    table = datasets.Dataset.from_list([{**s, "pixel_values": s["pixel_values"].tolist()} for s in samples])
    table = table.map(lambda s: {"labels": [x + LABEL_OFFSET for x in s["input_ids"]]}).with_format("torch")
    collate = OmniCollator(PAD, train_on_prompt=False)
    loader = torch.utils.data.DataLoader(table, batch_size=4, collate_fn=collate)
    for number, batch in enumerate(loader):
        chunk = [{**s, "labels": [token + LABEL_OFFSET for token in s["input_ids"]]}
                 for s in samples[4 * number:4 * number + 4]]
        assert_batches_equal(batch, collate(chunk))


def test_accelerate_moves_every_value_of_the_batch_block_mask_included():
    operations = pytest.importorskip("accelerate.utils.operations")
    samples = image_samples(4)
    batch = OmniCollator(PAD, mode="pack", max_length=64, return_block_mask=True)(samples)
    moved = operations.send_to_device(batch, "meta", non_blocking=True)
    assert moved.keys() == batch.keys()
    for key, value in moved.items():
        tensors = [getattr(value, f.name) for f in dataclasses.fields(value)] if key == "omni_block_mask" else [value]
        assert all(t.device.type == "meta" for t in tensors if isinstance(t, torch.Tensor)), key


def tiny_trainer(tmp_path, remove_unused_columns: bool):
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    rows = [{"input_ids": [1 + (i + t) % 31 for t in range(6 + i)], "modality_spans": [[1, 4]]} for i in range(8)]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                          remove_unused_columns=remove_unused_columns, report_to=[], use_cpu=True,
                                          save_strategy="no", logging_strategy="no")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(rows),
                                   data_collator=OmniCollator(PAD, return_block_mask=True))
    return trainer, model


def test_trainer_passes_the_collated_columns_to_the_model(tmp_path):
    trainer, model = tiny_trainer(tmp_path, remove_unused_columns=False)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs), with_kwargs=True)
    result = trainer.train()
    assert len(seen) == 2 and np.isfinite(result.training_loss)
    for kwargs in seen:
        assert {"input_ids", "labels", "attention_mask", "position_ids", "omni_doc_ids", "omni_group_ids",
                "omni_block_mask"} <= kwargs.keys()
        assert kwargs["omni_doc_ids"].shape == kwargs["input_ids"].shape
        assert isinstance(kwargs["omni_block_mask"], OmniBlockMask)


def test_trainer_dropping_modality_spans_is_a_clear_error(tmp_path):
    trainer, _ = tiny_trainer(tmp_path, remove_unused_columns=True)
    with pytest.raises(ValueError, match=r"'modality_spans'\].*remove_unused_columns=False"):
        trainer.train()


@pytest.mark.parametrize("block_size", [64, (64, 128)])
def test_block_size_int_or_pair_reaches_the_block_mask(block_size):
    samples = [{"input_ids": list(range(1, 151)), "modality_spans": [(10, 40)]},
               {"input_ids": list(range(1, 91)), "modality_spans": []}]
    batch = OmniCollator(pad_token_id=0, mode="pack", max_length=256, return_block_mask=True,
                         block_size=block_size)(samples)
    mask = batch["omni_block_mask"]
    assert (mask.block_q, mask.block_kv) == (block_size if isinstance(block_size, tuple) else (block_size,) * 2)
    expected = OmniBlockMask.from_token_ids(batch["omni_doc_ids"], batch["omni_group_ids"])
    assert torch.equal(mask.to_dense(), expected.to_dense())
