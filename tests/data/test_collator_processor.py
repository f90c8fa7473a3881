"""OmniCollator on samples straight from a Transformers processor: settings picked from the processor or the model
config, images found among the tokens and checked against the vision inputs, vision inputs and 3-D positions kept in
the packed order, raw conversations run through the processor, and the errors that name what disagrees.

Expected values come from the samples (their tokens, their vision inputs) and from the models' own code
(Qwen2-VL's ``get_rope_index``), never from the collator's arithmetic. The processed samples are the tiny families of
tests/helpers/vlm_samples.py.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch
import transformers

from omni_hf import OmniCollator, VisionInputs
from tests.helpers.vlm_samples import QWEN_TOKENS, sft_vlm, tiny, tiny_paligemma, with_images

IGNORE = -100


def output_samples(batch: dict, samples: list[dict]) -> list[tuple[int, int, np.ndarray]]:
    """(row, input sample, columns) of every output sample, row-major, found by matching its tokens (samples with
    equal tokens, which are interchangeable, in input order)."""
    found = []
    for row in range(batch["input_ids"].shape[0]):
        doc = batch["omni_doc_ids"][row]
        for d in range(int(doc.max()) + 1):
            columns = torch.nonzero(doc == d).flatten().numpy()
            tokens = batch["input_ids"][row, columns]
            used = {index for _, index, _ in found}
            matches = [i for i, s in enumerate(samples) if i not in used and torch.equal(s["input_ids"][0], tokens)]
            assert matches, f"row {row}, sample {d}: tokens of no input sample"
            found.append((row, matches[0], columns))
    assert sorted(index for _, index, _ in found) == list(range(len(samples)))
    return found


def image_runs(input_ids: torch.Tensor, image_id: int) -> list[tuple[int, int]]:
    """(start, end) of every run of ``image_id`` in a 1-D tensor, in a plain loop."""
    runs, start = [], None
    for i, token in enumerate([*input_ids.tolist(), None]):
        if token == image_id and start is None:
            start = i
        elif token != image_id and start is not None:
            runs.append((start, i))
            start = None
    return runs


# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize("arch, attention, token_keys", [
    ("gemma3", "bidirectional", ("token_type_ids",)),
    ("idefics3", "causal", ()),
    ("llava", "causal", ()),
])
def test_from_processor_and_from_config_pick_the_same_family_settings(arch, attention, token_keys):
    config, processor = sft_vlm.TINY[arch]()
    by_processor = OmniCollator.from_processor(processor)
    by_config = OmniCollator.from_config(config)
    assert by_processor.vision == by_config.vision
    assert by_processor.vision.image_token_ids == (config.image_token_id,)
    assert by_processor.vision.image_attention == attention and by_processor.vision.token_keys == token_keys
    assert by_processor.pad_token_id == processor.tokenizer.pad_token_id == by_config.pad_token_id
    assert by_processor.processor is processor and by_config.processor is None


def test_image_attention_override_and_explicit_pad_token_id():
    config, processor = sft_vlm.TINY["idefics3"]()
    collator = OmniCollator.from_processor(processor, image_attention="bidirectional", pad_token_id=7, mode="pack",
                                           max_length=64)
    assert collator.vision.image_attention == "bidirectional"
    assert (collator.pad_token_id, collator.mode, collator.max_length) == (7, "pack", 64)


# ---------------------------------------------------------------------- Qwen2-VL


def qwen2_5_vl_model(tokenizer) -> torch.nn.Module:
    """A tiny Qwen2.5-VL base model with the ids of ``tokenizer`` (for its ``get_rope_index``)."""
    qwen2 = sft_vlm.qwen2_vl_config(tokenizer)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=8, fullatt_block_indexes=[0])
    config = transformers.Qwen2_5_VLConfig(vision_config=vision, text_config=qwen2.text_config.to_dict(),
                                           image_token_id=qwen2.image_token_id, video_token_id=qwen2.video_token_id,
                                           vision_start_token_id=qwen2.vision_start_token_id,
                                           vision_end_token_id=qwen2.vision_end_token_id)
    return transformers.Qwen2_5_VLModel(config), config


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("trial", range(3))
def test_qwen_positions_are_the_models_rope_index_of_each_sample_alone(family, trial):
    """position_ids [4, B, L]: text positions, then the 3-D positions ``get_rope_index`` gives the sample alone,
    restarting for every packed sample; 0 on padding. Fresh random samples each run (the seed is in the message)."""
    seed = random.randrange(2**31)
    qwen2_config, samples = tiny("qwen2_vl", 6, seed)
    tokenizer = sft_vlm.byte_tokenizer(QWEN_TOKENS)
    if family == "qwen2_vl":
        config = qwen2_config
        model = transformers.Qwen2VLModel(config)
    else:
        model, config = qwen2_5_vl_model(tokenizer)
    batch = OmniCollator.from_config(config, mode="pack", max_length=200, pad_to_multiple_of=256,
                                     padding_side="left")(samples)
    positions = batch["position_ids"]
    assert positions.shape == (4, *batch["input_ids"].shape) and positions.dtype == torch.int64
    for row, index, columns in output_samples(batch, samples):
        sample = samples[index]
        length = sample["input_ids"].shape[1]
        assert positions[0, row, columns].tolist() == list(range(length))
        if "image_grid_thw" in sample:
            expected = model.get_rope_index(sample["input_ids"], sample["mm_token_type_ids"],
                                            image_grid_thw=sample["image_grid_thw"])[0][:, 0]
        else:
            expected = torch.arange(length).expand(3, -1)
        assert torch.equal(positions[1:, row, columns], expected), f"seed {seed}, sample {index}"
    padding = batch["omni_doc_ids"] < 0
    assert padding.any() and (positions[:, padding] == 0).all()


def test_qwen_grids_and_patches_follow_the_packed_order():
    """image_grid_thw rows and pixel_values patch rows come in the order the images' tokens appear in the batch
    (row-major), so the model's placeholder scatter and its rope index pair each image with its own tokens."""
    config, samples = with_images("qwen2_vl", 6, seed=4)
    batch = OmniCollator.from_config(config, mode="pack", max_length=160)(samples)
    order = [index for _, index, _ in output_samples(batch, samples)]
    assert order != sorted(order), "packing reorders the samples"
    with_grid = [samples[i] for i in order if "image_grid_thw" in samples[i]]
    assert torch.equal(batch["image_grid_thw"], torch.cat([s["image_grid_thw"] for s in with_grid]))
    assert torch.equal(batch["pixel_values"], torch.cat([s["pixel_values"] for s in with_grid]))
    runs = [end - start for row in batch["input_ids"] for start, end in image_runs(row, config.image_token_id)]
    assert runs == (batch["image_grid_thw"].prod(-1) // 4).tolist()
    assert torch.equal(batch["mm_token_type_ids"], (batch["input_ids"] == config.image_token_id).long())
    assert not any(key.endswith("_sample_index") for key in batch)


# ---------------------------------------------------------------------- Gemma3, Idefics3, PaliGemma


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_gemma3_each_image_is_a_block_and_its_tokens_get_no_labels(mode):
    config, samples = with_images("gemma3", 6, seed=5)
    options = {"mode": "pack", "max_length": 160} if mode == "pack" else {}
    batch = OmniCollator.from_config(config, **options)(samples)
    image = batch["input_ids"] == config.image_token_id
    assert torch.equal(batch["token_type_ids"], image.long())
    for row in range(image.shape[0]):
        runs = image_runs(batch["input_ids"][row], config.image_token_id)
        expected = torch.full_like(batch["omni_group_ids"][row], -1)
        for group, (start, end) in enumerate(runs):  # images of 4 tokens, one run each here
            assert end - start == config.mm_tokens_per_image
            expected[start:end] = group
        assert torch.equal(batch["omni_group_ids"][row], expected)
    assert (batch["labels"][image] == IGNORE).all()
    real_text = ~image & (batch["omni_doc_ids"] >= 0) & (batch["position_ids"] > 0)
    assert torch.equal(batch["labels"][real_text], batch["input_ids"][real_text])
    order = [index for _, index, _ in output_samples(batch, samples)]  # pad mode too: concatenated, not stacked
    assert torch.equal(batch["pixel_values"], torch.cat([samples[i]["pixel_values"] for i in order
                                                        if "pixel_values" in samples[i]]))


def test_idefics3_sub_images_are_concatenated_along_dim_1_and_zero_padded():
    """[1, n, 3, H, W] values of different sizes: one [1, N, 3, H_max, W_max], each padded with zeros at the end of
    its rows and columns, pixel_attention_mask with it; sub-images in packed order."""
    config, _ = sft_vlm.TINY["idefics3"]()
    rng = torch.Generator().manual_seed(6)
    image_id, text = config.image_token_id, torch.tensor([5, 6, 7])
    sizes = [(2, 16, 12), (1, 8, 16)]  # sub-images, height, width
    samples = []
    for count, height, width in sizes:
        ids = torch.cat([text, *([torch.full((4,), image_id), text] * count)])[None]
        samples.append({"input_ids": ids, "pixel_values": torch.randn(1, count, 3, height, width, generator=rng),
                        "pixel_attention_mask": torch.ones(1, count, height, width, dtype=torch.int64)})
    batch = OmniCollator.from_config(config)(samples)
    pixels, mask = batch["pixel_values"], batch["pixel_attention_mask"]
    assert pixels.shape == (1, 3, 3, 16, 16) and mask.shape == (1, 3, 16, 16)
    offset = 0
    for sample, (count, height, width) in zip(samples, sizes):
        block = slice(offset, offset + count)
        assert torch.equal(pixels[0, block, :, :height, :width], sample["pixel_values"][0])
        assert (pixels[0, block, :, height:] == 0).all() and (pixels[0, block, :, :, width:] == 0).all()
        assert mask[0, block, :height, :width].all() and mask[0, block].sum() == count * height * width
        offset += count
    assert (batch["omni_group_ids"] == -1).all(), "causal images"
    assert (batch["labels"][batch["input_ids"] == image_id] == IGNORE).all()


def test_paligemma_prefix_is_one_block_per_sample_and_positions_count_from_one():
    config, _ = tiny_paligemma()
    _, samples = tiny("paligemma", 4, seed=7)
    batch = OmniCollator.from_config(config, mode="pack", max_length=120)(samples)
    found = output_samples(batch, samples)
    for row, index, columns in found:
        prefix = int((samples[index]["token_type_ids"][0] == 0).sum())
        groups = batch["omni_group_ids"][row, columns]
        assert (groups[:prefix] == groups[0]).all() and groups[0] >= 0 and (groups[prefix:] == -1).all()
        assert batch["position_ids"][row, columns].tolist() == list(range(1, len(columns) + 1))
        labels = batch["labels"][row, columns]
        assert (labels[:prefix] == IGNORE).all()
        assert torch.equal(labels[prefix:], samples[index]["labels"][0, prefix:])
    prefixes = {(row, batch["omni_group_ids"][row, columns[0]].item()) for row, _, columns in found}
    assert len(prefixes) == len(samples), "each sample's prefix is its own block"


# ---------------------------------------------------------------------- conversations


def test_raw_conversations_collate_like_their_processed_samples_with_the_answer_as_the_only_labels():
    """A collator from a processor takes TRL's rows (images + messages); with train_on_prompt=False only the final
    answer (its text and the template's newline) keeps labels."""
    config, processor = sft_vlm.TINY["gemma3"]()
    rows = list(sft_vlm.synthetic_dataset(6, seed=8))
    collator = OmniCollator.from_processor(processor, mode="pack", max_length=400, train_on_prompt=False)
    batch = collator(rows)
    for row, index, columns in output_samples(batch, [collator._processed(r, i) for i, r in enumerate(rows)]):
        answer = rows[index]["messages"][-1]["content"][0]["text"] + "\n"
        answer_ids = processor.tokenizer(answer, add_special_tokens=False)["input_ids"]
        labels = batch["labels"][row, columns]
        kept = labels[labels != IGNORE].tolist()
        assert kept == answer_ids and labels[-len(answer_ids):].tolist() == answer_ids


def test_prompt_completion_rows_keep_labels_on_the_completion():
    _, processor = sft_vlm.TINY["llava"]()
    row = next(iter(sft_vlm.synthetic_dataset(1, seed=9)))
    prompt, completion = row["messages"][:1], row["messages"][1:]
    collator = OmniCollator.from_processor(processor, train_on_prompt=False)
    batch = collator([{"images": row["images"], "prompt": prompt, "completion": completion}])
    expected = processor.tokenizer(completion[0]["content"][0]["text"] + "\n", add_special_tokens=False)["input_ids"]
    assert batch["labels"][batch["labels"] != IGNORE].tolist() == expected


def test_dataloader_workers_process_raw_conversations_as_the_main_process_does():
    """The collator with its processor goes to DataLoader workers (pickled with spawn, copied with fork) intact."""
    _, processor = sft_vlm.TINY["idefics3"]()
    rows = list(sft_vlm.synthetic_dataset(8, seed=17))
    collator = OmniCollator.from_processor(processor, mode="pack", max_length=300, train_on_prompt=False)
    loader = torch.utils.data.DataLoader(rows, batch_size=4, num_workers=2, collate_fn=collator)
    for number, batch in enumerate(loader):
        expected = collator(rows[4 * number:4 * number + 4])
        assert batch.keys() == expected.keys() and all(torch.equal(batch[k], expected[k]) for k in expected)


# ---------------------------------------------------------------------- errors


def qwen_sample(seed: int = 10) -> tuple[transformers.PretrainedConfig, dict]:
    """A Qwen2-VL sample with two images."""
    config, samples = tiny("qwen2_vl", 12, seed)
    return config, next(s for s in samples if "image_grid_thw" in s and len(s["image_grid_thw"]) == 2)


def move_one_image_token(sample: dict, image_id: int) -> dict:
    """The first image's last token moved in front of the second image's run (the token counts unchanged)."""
    ids = sample["input_ids"].clone()
    (_, end), (start, _) = image_runs(ids[0], image_id)[:2]
    ids[0, end - 1], ids[0, start - 1] = ids[0, start - 1].item(), image_id  # before the second run: its start token
    return sample | {"input_ids": ids}


def drop_first_image_token(sample: dict, image_id: int) -> dict:
    ids = sample["input_ids"][0]
    first = int(torch.nonzero(ids == image_id)[0])
    keep = torch.arange(len(ids)) != first
    return sample | {"input_ids": ids[keep][None], "mm_token_type_ids": sample["mm_token_type_ids"][:, keep],
                     "attention_mask": sample["attention_mask"][:, keep]}


QWEN_ERRORS = {
    "grid row missing": (lambda s, c: s | {"image_grid_thw": s["image_grid_thw"][:1]},
                         r"samples\[0\]\['pixel_values'\]: expected \d+ patch rows \(the sum of t \* h \* w over "
                         r"image_grid_thw\), got \d+"),
    "token run cut": (lambda s, c: drop_first_image_token(s, c.image_token_id),
                      r"samples\[0\]\['input_ids'\]: expected \d+ image tokens \(2 images of \[\d+, \d+\] tokens, "
                      r"image_grid_thw: t \* h \* w / 4\), got \d+"),
    "runs split otherwise": (lambda s, c: move_one_image_token(s, c.image_token_id),
                             r"samples\[0\]\['input_ids'\]: expected image-token one run per image of \[\d+, \d+\] "
                             r"tokens .*got runs of \[\d+, \d+\] tokens"),
    "patches missing": (lambda s, c: s | {"pixel_values": s["pixel_values"][:-1]},
                        r"samples\[0\]\['pixel_values'\]: expected \d+ patch rows"),
    "odd grid": (lambda s, c: s | {"image_grid_thw": torch.tensor([[1, 3, 3], [1, 3, 3]])},
                 r"samples\[0\]\['image_grid_thw'\]: expected rows \(t, h, w\) of positive ints with h \* w a multiple "
                 r"of merge_size\*\*2 = 4, got \[\[1, 3, 3\], \[1, 3, 3\]\]"),
    "video": (lambda s, c: s | {"video_grid_thw": torch.tensor([[2, 4, 4]])},
              r"samples\[0\]\['video_grid_thw'\]: expected no video inputs \(not supported yet\), got one"),
    "spans given": (lambda s, c: s | {"modality_spans": [(0, 2)]},
                    r"samples\[0\]\['modality_spans'\]: expected no such key \(with vision settings"),
    "padding inside": (lambda s, c: s | {"attention_mask": torch.cat([torch.zeros(1, 1, dtype=torch.int64),
                                                                      s["attention_mask"][:, 1:]], 1)},
                       r"samples\[0\]\['attention_mask'\]: expected all ones .*got 1 zeros"),
    "token types short": (lambda s, c: s | {"mm_token_type_ids": s["mm_token_type_ids"][:, 1:]},
                          r"samples\[0\]\['mm_token_type_ids'\]: expected \d+ values \(the length of input_ids\)"),
}


@pytest.mark.parametrize("case", list(QWEN_ERRORS))
def test_qwen_sample_whose_tokens_and_vision_inputs_disagree_raises_naming_both(case):
    config, sample = qwen_sample()
    change, match = QWEN_ERRORS[case]
    with pytest.raises(ValueError, match=match):
        OmniCollator.from_config(config)([change(sample, config)])


def test_image_counts_against_pixel_values_raise_for_fixed_and_equal_sizes():
    """Gemma3 (4 tokens per image) and LLaVA (an equal share of the image tokens per image) with their pixel_values
    repeated: more images than the tokens hold."""
    config, samples = with_images("gemma3", 6, seed=11)
    sample = next(s for s in samples if "pixel_values" in s)
    n = len(sample["pixel_values"])
    doubled = sample | {"pixel_values": torch.cat([sample["pixel_values"]] * 2)}
    with pytest.raises(ValueError, match=rf"samples\[0\]\['input_ids'\]: expected {8 * n} image tokens \({2 * n} "
                                         rf"images of \[4(, 4)*\] tokens, {2 * n} images in pixel_values, "
                                         rf"tokens_per_image\), got {4 * n}"):
        OmniCollator.from_config(config)([doubled])
    config, samples = with_images("llava", 6, seed=11)
    sample = next(s for s in samples if "pixel_values" in s)
    n = len(sample["pixel_values"])
    tripled = sample | {"pixel_values": torch.cat([sample["pixel_values"]] * 3)}
    with pytest.raises(ValueError, match=rf"samples\[0\]\['input_ids'\]: expected a positive multiple of {3 * n} "
                                         rf"image tokens \(an equal share for each of the {3 * n} images in "
                                         rf"pixel_values\), got {16 * n}"):
        OmniCollator.from_config(config)([tripled])


@pytest.mark.parametrize("arch", ["gemma3", "llava", "qwen2_vl"])
def test_image_tokens_without_pixel_values_raise_naming_pixel_values(arch):
    config, samples = with_images(arch, 6, seed=12)
    sample = next(s for s in samples if "pixel_values" in s)
    collator = OmniCollator.from_config(config)
    image_tokens = int(np.isin(np.asarray(sample["input_ids"]), collator.vision.image_token_ids).sum())
    with pytest.raises(ValueError, match=rf"samples\[1\]\['pixel_values'\]: expected the vision inputs of the "
                                         rf"sample's {image_tokens} image tokens, got no such key"):
        collator([samples[0], {k: v for k, v in sample.items() if k != "pixel_values"}])


def test_missing_input_ids_raise_naming_the_sample_and_key():
    config, samples = with_images("gemma3", 6, seed=12)
    sample = next(s for s in samples if "pixel_values" in s)
    with pytest.raises(ValueError, match=r"samples\[1\]\['input_ids'\]: expected token ids, got no such key "
                                         r"\(keys: \[.*'pixel_values'"):
        OmniCollator.from_config(config)([samples[0], {k: v for k, v in sample.items() if k != "input_ids"}])
    with pytest.raises(ValueError, match=r"samples\[0\]\['input_ids'\]: expected token ids, got no such key "
                                         r"\(keys: \['modality_spans'\]\)"):
        OmniCollator(pad_token_id=0)([{"modality_spans": []}])


def test_paligemma_suffix_before_the_prefix_ends_raises():
    config, _ = tiny_paligemma()
    _, samples = tiny("paligemma", 1, seed=13)
    types = samples[0]["token_type_ids"].clone()
    types[0, 2] = 1
    with pytest.raises(ValueError, match=r"samples\[0\]\['token_type_ids'\]: expected 0 on a prefix, then 1 "
                                         r"\(image_attention='prefix'\), got a 0 at token 3 after the prefix"):
        OmniCollator.from_config(config)([samples[0] | {"token_type_ids": types}])


def test_long_image_sample_is_never_split_but_long_text_is():
    config, samples = with_images("gemma3", 6, seed=14)
    text_only = next(s for s in samples if "pixel_values" not in s)
    with_image = next(s for s in samples if "pixel_values" in s)
    limit = min(text_only["input_ids"].shape[1], with_image["input_ids"].shape[1]) - 1
    collator = OmniCollator.from_config(config, mode="pack", max_length=limit, split_long_text=True)
    assert collator([text_only])["input_ids"].shape[0] == 2
    with pytest.raises(ValueError, match=r"samples\[0\]\['input_ids'\]: .*it has modality spans or image tokens"):
        collator([with_image])


def test_conversation_without_a_processor_raises_naming_input_ids():
    config, _ = sft_vlm.TINY["gemma3"]()
    row = next(iter(sft_vlm.synthetic_dataset(1, seed=15)))
    with pytest.raises(ValueError, match=r"samples\[0\]\['input_ids'\]: expected token ids \(a conversation needs a "
                                         r"collator with a processor: OmniCollator.from_processor\)"):
        OmniCollator.from_config(config)([row])


def test_conversation_of_an_unknown_form_raises_naming_its_keys():
    _, processor = sft_vlm.TINY["gemma3"]()
    with pytest.raises(ValueError, match=r"samples\[0\]: expected 'input_ids', 'messages', or 'prompt' and "
                                         r"'completion', got keys \['images', 'text'\]"):
        OmniCollator.from_processor(processor)([{"images": [], "text": "hi"}])


def test_settings_errors_name_the_argument():
    config, processor = sft_vlm.TINY["gemma3"]()
    processor.tokenizer.pad_token = None
    with pytest.raises(ValueError, match=r"pad_token_id: expected an int \(the processor's tokenizer has no pad "
                                         r"token; pass pad_token_id=...\), got None"):
        OmniCollator.from_processor(processor)
    with pytest.raises(ValueError, match=r"processor: expected one of \('Qwen2VLProcessor', .*got Tokenizers"):
        OmniCollator.from_processor(processor.tokenizer)
    with pytest.raises(ValueError, match=r"config.model_type: expected one of \('qwen2_vl', .*got 'llama'"):
        OmniCollator.from_config(transformers.LlamaConfig())
    with pytest.raises(ValueError, match=r"image_attention: expected one of \('causal', 'bidirectional', 'prefix'\), "
                                         r"got 'full'"):
        OmniCollator.from_config(config, image_attention="full")
    with pytest.raises(ValueError, match=r"vision: expected a VisionInputs with a processor"):
        OmniCollator(0, processor=processor)
    vision = OmniCollator.from_config(config).vision
    for change, match in (
        ({"image_token_ids": ()}, r"image_token_ids / image_type_key: expected exactly one of them"),
        ({"image_token_ids": (), "image_type_key": "mm_token_type_ids"}, r"image_type_key: expected one of token_keys"),
        ({"image_keys": {"pixel_values": 2}}, r"image_keys: expected a dim of 0 or 1"),
        ({"count_key": "image_sizes"}, r"count_key: expected one of image_keys \('pixel_values',\)"),
        ({"tokens_per_image": 0}, r"tokens_per_image: expected a positive int or None, got 0"),
        ({"image_attention": "prefix", "token_keys": ()}, r"token_keys: expected 'token_type_ids' among them"),
    ):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(vision, **change)


def test_image_type_key_finds_the_images_without_token_ids():
    """Gemma3's token_type_ids (1 = image token) instead of its image token id: the same batch."""
    config, samples = with_images("gemma3", 6, seed=16)
    vision = dataclasses.replace(OmniCollator.from_config(config).vision, image_token_ids=(),
                                 image_type_key="token_type_ids")
    by_type = OmniCollator(0, vision=vision, mode="pack", max_length=160)(samples)
    by_id = OmniCollator.from_config(config, mode="pack", max_length=160)(samples)
    assert by_type.keys() == by_id.keys() and all(torch.equal(by_type[k], by_id[k]) for k in by_id)
    assert isinstance(vision, VisionInputs) and (by_id["omni_group_ids"] >= 0).any()
