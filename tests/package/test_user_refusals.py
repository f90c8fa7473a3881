"""Inputs a user can get wrong are refused with an error naming the argument, what was expected and what was
received, instead of being accepted with a silently different meaning: a collator asked to ignore prompts of samples
that do not say where their prompt ends, negative token ids, a non-positive or non-finite attention scale, a mask
whose batch does not fit q's, and an empty sequence of token-rule ids."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from omni_hf import OmniBlockMask, OmniCollator, omni_attention


def random_sample(rng: np.random.Generator, **extra) -> dict:
    length = int(rng.integers(2, 30))
    return {"input_ids": rng.integers(1, 1000, length).tolist(), "modality_spans": [], **extra}


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_collator_ignoring_prompts_refuses_a_sample_without_prompt_length(mode):
    rng = np.random.default_rng(0)
    samples = [random_sample(rng, prompt_length=1), random_sample(rng)]
    collate = OmniCollator(0, mode=mode, max_length=64, train_on_prompt=False)
    with pytest.raises(ValueError, match=r"samples\[1\]\['prompt_length'\]: expected an int in \[0, \d+\] with "
                                         r"train_on_prompt=False .*got no such key"):
        collate(samples)


def test_collator_ignoring_prompts_takes_prompt_length_zero_as_the_whole_sample():
    rng = np.random.default_rng(1)
    sample = random_sample(rng, prompt_length=0)
    ignoring = OmniCollator(0, train_on_prompt=False)([sample])
    training = OmniCollator(0)([{key: value for key, value in sample.items() if key != "prompt_length"}])
    assert torch.equal(ignoring["labels"], training["labels"])
    assert (ignoring["labels"][0, 1:] == torch.tensor(sample["input_ids"][1:])).all()


@pytest.mark.parametrize("convert", [list, np.array, torch.tensor])
def test_collator_refuses_negative_token_ids_naming_the_first(convert):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 1000, 12)
    position = int(rng.integers(0, 12))
    ids[position] = -int(rng.integers(1, 10))
    samples = [random_sample(rng), {"input_ids": convert(ids.tolist()), "modality_spans": []}]
    with pytest.raises(ValueError, match=rf"samples\[1\]\['input_ids'\]: expected token ids >= 0, got {ids[position]} "
                                         rf"at position {position}$"):
        OmniCollator(0)(samples)


def test_collator_refuses_the_negative_ids_of_a_short_sample():
    with pytest.raises(ValueError, match=r"samples\[0\]\['input_ids'\]: expected token ids >= 0, got -5 at position 0"):
        OmniCollator(0)([{"input_ids": [-5, 2, 3], "modality_spans": []}])


def attention_inputs(batch: int = 1) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    q = torch.randn(batch, 2, 40, 16)
    k, v = torch.randn(2, batch, 1, 40, 16)
    return q, k, v


@pytest.mark.parametrize("scale", [-1.0, 0.0, -0.125, math.inf, -math.inf, math.nan])
def test_attention_refuses_a_scale_that_is_not_positive_and_finite(scale):
    q, k, v = attention_inputs()
    with pytest.raises(ValueError, match=r"scale: expected a positive finite float or None, got "):
        omni_attention(q, k, v, OmniBlockMask.causal(40, 40), scale=scale)


def test_attention_takes_a_positive_scale():
    q, k, v = attention_inputs()
    out = omni_attention(q, k, v, OmniBlockMask.causal(40, 40), scale=0.5)
    scores = (q @ k.transpose(-1, -2)) * 0.5
    scores = scores.masked_fill(~torch.ones(40, 40, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(out, scores.softmax(-1) @ v)


def test_attention_names_the_batch_a_mask_must_have_for_a_single_row():
    q, k, v = attention_inputs(batch=1)
    doc_ids = torch.tensor([[0] * 40, [0] * 20 + [1] * 20])
    with pytest.raises(ValueError, match=r"^block_mask: expected batch 1 \(q's batch\), got 2$"):
        omni_attention(q, k, v, OmniBlockMask.from_token_ids(doc_ids))


def test_attention_names_the_batches_a_mask_may_have():
    q, k, v = attention_inputs(batch=2)
    doc_ids = torch.zeros(3, 40, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"^block_mask: expected batch 1 or 2 \(q's batch; a mask of batch 1 serves "
                                         r"every row\), got 3$"):
        omni_attention(q, k, v, OmniBlockMask.from_token_ids(doc_ids))


@pytest.mark.parametrize("shape", [(1, 0), (0,), (3, 0)])
def test_token_rule_ids_of_no_tokens_are_called_an_empty_sequence(shape):
    with pytest.raises(ValueError, match=rf"^doc_ids: expected at least one token \(kv_len >= 1\), got an empty "
                                         rf"sequence, shape \({shape[0] if len(shape) == 2 else 1}, 0\)$"):
        OmniBlockMask.from_token_ids(torch.zeros(shape, dtype=torch.int64))
