"""The model zoo: attn_implementation="omni" across Transformers model families.

Tiny random models (one set of seeded weights per pair), float32 on the CPU, where omni runs its exact reference
path: the outputs on real-token positions and the gradient of every parameter must be within 1e-5 relative error
of eager or sdpa, greedy generation must be token-equal, and the documented refusals must raise a clear error.
Each case also counts the attention calls that reach omni, so a model (or a tower of it) that bypassed the
interface could not pass by running eager on both sides.
"""

import collections
import contextlib
import copy
import inspect
import json
import re
from collections.abc import Callable

import pytest
import torch
import transformers
from transformers import (
    AttentionInterface,
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertModel,
    CLIPConfig,
    CLIPModel,
    CLIPVisionConfig,
    DeepseekVLHybridConfig,
    DeepseekVLHybridForConditionalGeneration,
    FalconConfig,
    FalconForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Gemma4AudioModel,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    GemmaConfig,
    GotOcr2Config,
    GotOcr2ForConditionalGeneration,
    GptOssConfig,
    GptOssForCausalLM,
    Idefics3Config,
    InternVLConfig,
    Llama4Config,
    Llama4ForCausalLM,
    Llama4TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    Mistral3Config,
    MistralConfig,
    MistralForCausalLM,
    ModernBertConfig,
    ModernBertModel,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    Pix2StructConfig,
    Pix2StructForConditionalGeneration,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3OmniMoeThinkerConfig,
    Qwen3OmniMoeThinkerForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
    SiglipConfig,
    SiglipModel,
    SiglipVisionConfig,
    T5Config,
    T5ForConditionalGeneration,
    UdopConfig,
    UdopForConditionalGeneration,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

import omni_hf
from omni_hf import OmniBlockMask, OmniCollator, VisionInputs
from omni_hf.integrations.transformers import omni_attention_forward
from omni_hf.integrations.transformers.packed_towers import PACKED
from tests.helpers.model_checks import assert_close_to_reference, joined_key_bias, models, padding

CPU = torch.device("cpu")
VOCAB = 100
# special tokens at the top of the vocabulary; `text` draws below them
IMAGE, BOI, EOI, VISION_START, VISION_END, VIDEO, AUDIO, BOA, EOA = 99, 98, 97, 96, 95, 94, 93, 92, 91
TEXT_TOKENS = 90



# ---------------------------------------------------------------------- helpers


def text(batch: int, length: int, seed: int) -> torch.Tensor:
    """int64 [batch, length] random text tokens (no special token)."""
    return torch.randint(3, TEXT_TOKENS, (batch, length), generator=torch.Generator().manual_seed(seed))


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def installed(name: str) -> type:
    """Transformers' class ``name``; skips the test where the installed Transformers lacks it (a family newer than
    the oldest Transformers omni_hf supports, which CI also tests)."""
    cls = getattr(transformers, name, None)
    if cls is None:
        pytest.skip(f"{name} is not in Transformers {transformers.__version__}")
    return cls


def from_config(model_class, config) -> Callable[[str], torch.nn.Module]:
    """``build(attn)`` for `models`: each model gets its own copy of ``config``."""
    return lambda attn: model_class._from_config(copy.deepcopy(config), attn_implementation=attn)


@contextlib.contextmanager
def omni_calls():
    """Counts the attention calls that reach omni, by attention module class."""
    calls = collections.Counter()

    def counting(module, *args, **kwargs):
        calls[type(module).__name__] += 1
        return omni_attention_forward(module, *args, **kwargs)

    for name in ("omni", PACKED):  # PACKED: a packed vision tower's calls (packed_towers)
        AttentionInterface.register(name, counting)
    try:
        yield calls
    finally:
        omni_hf.register()


def outputs_and_grads(model, inputs: dict, select: Callable) -> tuple[list[torch.Tensor], dict]:
    """The tensors ``select(model(**inputs))`` picks, and every parameter's gradient of a fixed random linear
    loss on them (the same probe for omni and the reference)."""
    model.zero_grad()
    outputs = select(model(**inputs))
    probe = torch.Generator().manual_seed(7)
    loss = sum((out * torch.randn(out.shape, generator=probe)).sum() for out in outputs)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return [out.detach() for out in outputs], grads


def assert_omni_matches(build, inputs: dict, select: Callable, reaches: dict[str, int], reference="eager",
                        own: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """omni against ``reference`` on one set of weights: the outputs ``select`` picks (real-token positions
    only: Transformers leaves rows of padding tokens arbitrary) and every parameter gradient, to 1e-5 relative
    error. ``reaches``: the attention calls per module class that must reach omni in the forward. ``own``: the
    towers (model class name) that keep their own attention under omni, and the implementation they run. Returns
    omni's parameter gradients by name."""
    omni, ref, _ = models(build, CPU, reference)
    assert_implementations(omni, "omni", own or {})
    assert_implementations(ref, reference, {})
    with omni_calls() as calls:
        got, grads = outputs_and_grads(omni, inputs, select)
    assert dict(calls) == reaches
    expected, ref_grads = outputs_and_grads(ref, inputs, select)
    for i, (out, ref_out) in enumerate(zip(got, expected, strict=True)):
        assert_close_to_reference(out, ref_out, what=f"output {i}")
    assert grads.keys() == ref_grads.keys() and grads
    for name in ref_grads:
        assert_close_to_reference(*(joined_key_bias(g, name) for g in (grads, ref_grads)), what=name)
    return grads


def assert_implementations(model: torch.nn.Module, attn: str, own: dict[str, str]):
    """Every module's config names ``attn``, but those of the towers in ``own`` (by model class name) and their
    modules, which name the implementation given there."""
    own_configs = {id(m.config): own[type(m).__name__] for m in model.modules() if type(m).__name__ in own}
    assert len(set(own_configs.values())) == len(set(own.values())), f"towers missing: {own}"
    configured = [m for m in model.modules() if hasattr(m, "config")]
    implementations = {(type(m).__name__, m.config._attn_implementation) for m in configured}
    expected = {(type(m).__name__, own_configs.get(id(m.config), attn)) for m in configured}
    assert implementations == expected, implementations - expected


def logits_at(rows: torch.Tensor) -> Callable:
    return lambda out: [out.logits[rows]]


# Each VLM family runs one row and a left-padded batch of two (its row 1 padded, row 0 the first row).
ROWS = pytest.mark.parametrize("rows", [1, 2], ids=["one row", "left-padded batch of two"])


def first_row(inputs: dict, rows: int, **images) -> dict:
    """``inputs`` (a batch of two) for ``rows`` 2; for ``rows`` 1 its row 0: the first row of every tensor of first dim
    2 (ids, masks, one image per row), and ``images``, the inputs of row 0's images where the batch does not hold one
    image per row."""
    if rows == 2:
        return inputs
    first = {key: value[:1] if isinstance(value, torch.Tensor) and value.shape[0] == 2 else value
             for key, value in inputs.items()}
    return first | images


def qwen_rows(inputs: dict, rows: int) -> dict:
    """`first_row` of a `qwen_image_batch`: row 0 holds its first two images."""
    patches = int(inputs["image_grid_thw"][:2].prod(-1).sum())
    return first_row(inputs, rows, pixel_values=inputs["pixel_values"][:patches],
                     image_grid_thw=inputs["image_grid_thw"][:2])


GREEDY = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, cache_implementation="dynamic", pad_token_id=0)


def assert_greedy_generation_token_equal(build, inputs: dict, reference: str, cache: str = "dynamic"):
    """Greedy generation (dynamic cache, or ``cache``) of omni equals the reference's, token for token. No row may
    repeat one token throughout: that would only test the prompt's last step. An encoder-decoder's output holds only
    the decoder's tokens (after its start token)."""
    omni, ref, _ = models(build, CPU, reference)
    greedy = dict(GREEDY, cache_implementation=cache)
    generated = omni.generate(**inputs, **greedy)
    prompt = 1 if omni.config.is_encoder_decoder else inputs["input_ids"].shape[1]
    new_tokens = generated[:, prompt:].tolist()
    assert len(new_tokens[0]) == GREEDY["max_new_tokens"] and all(len(set(row)) > 1 for row in new_tokens)
    assert torch.equal(generated, ref.generate(**inputs, **greedy))


# ---------------------------------------------------------------------- decoder LMs


def llama_config():
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)


def mistral_config():
    return MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                         sliding_window=4)


def llama4_config():
    """Layer 0 attends in chunks of 4 tokens (the layers that use RoPE do), layer 1 fully."""
    return Llama4TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, intermediate_size_mlp=96,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                            attention_chunk_size=4, no_rope_layers=[1, 0], num_local_experts=2,
                            num_experts_per_tok=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                            eos_token_id=2)


def gemma2_config(softcap: float | None = 1.0):
    """Weights ten times the default scale, so that attention scores reach the softcap's curved part."""
    return Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                        max_position_embeddings=64, sliding_window=4, attn_logit_softcapping=softcap,
                        final_logit_softcapping=30.0, initializer_range=0.2, tie_word_embeddings=False)


def gemma3_text_config(head_dim: int = 16):
    return Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                            max_position_embeddings=64, sliding_window=4,
                            layer_types=["sliding_attention", "full_attention"])


# name: model class, config, attention module class, reference (sdpa; eager for Gemma2, which refuses
# attn_implementation="sdpa" in Transformers 5 and softcaps only in eager)
DECODER_LMS = {
    "llama-gqa": (LlamaForCausalLM, llama_config, "LlamaAttention", "sdpa"),
    "mistral-sliding": (MistralForCausalLM, mistral_config, "MistralAttention", "sdpa"),
    "llama4-chunked": (Llama4ForCausalLM, llama4_config, "Llama4TextAttention", "sdpa"),
    "gemma2-softcap-sliding": (Gemma2ForCausalLM, gemma2_config, "Gemma2Attention", "eager"),
    "gemma3-text-sliding-and-full": (Gemma3ForCausalLM, gemma3_text_config, "Gemma3Attention", "sdpa"),
}


@pytest.mark.parametrize("reference", ["eager", "sdpa"])
@pytest.mark.parametrize("name", [name for name, (*_, ref) in DECODER_LMS.items() if ref == "sdpa"])  # Gemma2: below
def test_decoder_lm_with_left_and_right_padding_matches(name, reference):
    """GQA, windows and chunks of 4 (of 16 tokens), sliding + full layers; rows padded left, not at all, right."""
    model_class, config, attention, _ = DECODER_LMS[name]
    input_ids = text(3, 16, seed=1)
    attention_mask = torch.cat([padding([11, 16], 16, left=True), padding([9], 16, left=False)])
    assert_omni_matches(from_config(model_class, config()), dict(input_ids=input_ids, attention_mask=attention_mask),
                        logits_at(attention_mask.bool()), {attention: 2}, reference)


def gpt_oss_config():
    """Sliding (window 4) and full layers, GQA, 4 experts top-2: every attention call passes its sinks (``s_aux``)."""
    return GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=4, layer_types=["sliding_attention", "full_attention"])


@pytest.mark.parametrize("lengths", [[16], [11, 16]], ids=["one row", "left-padded batch of two"])
def test_gpt_oss_attention_sinks_match_eager_with_their_gradients(lengths):
    """GPT-OSS's learnable sinks run on omni: logits and every gradient, the sinks' own included, as eager's."""
    attention_mask = padding(lengths, 16, left=True)
    input_ids = text(len(lengths), 16, seed=5)
    build = from_config(GptOssForCausalLM, gpt_oss_config())
    assert sum(name.endswith("self_attn.sinks") for name, _ in build("eager").named_parameters()) == 2
    assert_omni_matches(build, dict(input_ids=input_ids, attention_mask=attention_mask),
                        logits_at(attention_mask.bool()), {"GptOssAttention": 2})


def test_gemma2_attention_softcap_and_sliding_window_match_eager():
    """Gemma2 softcaps attention scores (cap 1.0), which only eager does; the cap is checked to matter."""
    input_ids = text(2, 16, seed=2)
    attention_mask = padding([12, 16], 16, left=True)
    inputs, rows = dict(input_ids=input_ids, attention_mask=attention_mask), attention_mask.bool()
    assert_omni_matches(from_config(Gemma2ForCausalLM, gemma2_config()), inputs, logits_at(rows),
                        {"Gemma2Attention": 2})
    with torch.no_grad():
        capped, uncapped = (models(from_config(Gemma2ForCausalLM, gemma2_config(cap)), CPU)[0](**inputs).logits[rows]
                            for cap in (1.0, None))
    assert (capped - uncapped).norm() > 1e-2 * capped.norm()


@pytest.mark.parametrize("name", list(DECODER_LMS))
def test_decoder_lm_greedy_generate_on_left_padded_prompts_is_token_equal(name):
    """Batch 2, prompts of 8 and 5 tokens, 10 new tokens: the cache outgrows windows and chunks of 4."""
    model_class, config, _, reference = DECODER_LMS[name]
    inputs = dict(input_ids=text(2, 8, seed=3), attention_mask=padding([8, 5], 8, left=True))
    assert_greedy_generation_token_equal(from_config(model_class, config()), inputs, reference)


# ---------------------------------------------------------------------- vision-language models


def gemma3_vlm_config(head_dim: int = 16):
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=24, patch_size=4)
    return Gemma3Config(text_config=gemma3_text_config(head_dim), vision_config=vision, mm_tokens_per_image=9,
                        image_token_index=IMAGE, boi_token_index=BOI, eoi_token_index=EOI, tie_word_embeddings=False)


def gemma3_image_batch() -> dict:
    """Images of 9 tokens (longer than the window of 4), two in row 0 and one in left-padded row 1."""
    input_ids = text(2, 30, seed=4)
    image = torch.tensor([BOI] + [IMAGE] * 9 + [EOI])
    input_ids[0, 2:13], input_ids[0, 16:27], input_ids[1, 8:19] = image, image, image
    return dict(input_ids=input_ids, attention_mask=padding([30, 26], 30, left=True),
                pixel_values=randn(3, 3, 24, 24, seed=5), token_type_ids=(input_ids == IMAGE).long())


@pytest.mark.parametrize("head_dim", [16, 256])  # 256: Gemma 3's own
def test_gemma3_images_are_bidirectional_blocks_in_sliding_and_full_layers_like_eager(head_dim):
    """token_type_ids make each image one block; in sliding layers it is whole although longer than the window."""
    inputs = gemma3_image_batch()
    assert_omni_matches(from_config(Gemma3ForConditionalGeneration, gemma3_vlm_config(head_dim)), inputs,
                        logits_at(inputs["attention_mask"].bool()), {"SiglipAttention": 1, "Gemma3Attention": 2})


def paligemma_config(language_config=GemmaConfig, head_dim=16, **sliding):
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=4, vision_use_head=False)
    language = language_config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=1, head_dim=head_dim,
                               max_position_embeddings=64, **sliding)
    return PaliGemmaConfig(vision_config=vision, text_config=language, image_token_index=IMAGE, vocab_size=VOCAB,
                           projection_dim=64, hidden_size=64, tie_word_embeddings=False)


def paligemma_batch(pad: str | None) -> dict:
    """Batch 2 of 30 tokens: an image (16 tokens) and a prompt make the prefix (token_type_ids 0: 19 and 23
    tokens), then the suffix (1); row 0 has 4 padding tokens on side ``pad`` (None: no padding)."""
    seq, image, prefix = 30, 16, [19, 23]
    real = [26, 30] if pad else [30, 30]
    input_ids = text(2, seq, seed=6)
    token_type_ids = torch.zeros_like(input_ids)
    for row in range(2):
        start = seq - real[row] if pad == "left" else 0
        input_ids[row, start:start + image] = IMAGE
        token_type_ids[row, start + prefix[row]:start + real[row]] = 1
    return dict(input_ids=input_ids, attention_mask=padding(real, seq, left=pad == "left"),
                token_type_ids=token_type_ids, pixel_values=randn(2, 3, 16, 16, seed=7))


@pytest.mark.parametrize("pad", ["left", "right", None], ids=["left-padding", "right-padding", "no-padding"])
def test_paligemma_prefix_lm_batch_of_two_matches_eager(pad):
    """The prefix attends bidirectionally, the suffix causally; the rows' prefixes differ in length."""
    inputs = paligemma_batch(pad)
    assert_omni_matches(from_config(PaliGemmaForConditionalGeneration, paligemma_config()), inputs,
                        logits_at(inputs["attention_mask"].bool()), {"SiglipAttention": 1, "GemmaAttention": 2})


@pytest.mark.parametrize("head_dim", [16, 256])  # 256: PaliGemma 2's own
def test_paligemma2_prefix_lm_with_sliding_window_layers_matches_eager(head_dim):
    """PaliGemma 2 (Gemma2 text): the prefix block in both the sliding (window 4) and the full layers."""
    config = paligemma_config(Gemma2Config, head_dim=head_dim, sliding_window=4, query_pre_attn_scalar=head_dim)
    inputs = paligemma_batch("left")
    assert_omni_matches(from_config(PaliGemmaForConditionalGeneration, config), inputs,
                        logits_at(inputs["attention_mask"].bool()), {"SiglipAttention": 1, "Gemma2Attention": 2})


@pytest.mark.parametrize("model_class, config, batch", [
    (PaliGemmaForConditionalGeneration, paligemma_config, lambda: paligemma_batch("left")),
    (Gemma3ForConditionalGeneration, gemma3_vlm_config, gemma3_image_batch),
], ids=["paligemma-prefix", "gemma3-images"])
def test_vlm_greedy_generate_on_left_padded_prompts_is_token_equal_to_sdpa(model_class, config, batch):
    """Image blocks in the prompt, decoding with a dynamic cache after it."""
    assert_greedy_generation_token_equal(from_config(model_class, config()), batch(), "sdpa")


# The language model of the Qwen2-VL family's tests (3-D rope sections of a 16-wide head).
QWEN_LANGUAGE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})


def qwen2_vl_config():
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2)
    return Qwen2VLConfig(vision_config=vision, text_config=QWEN_LANGUAGE, image_token_id=IMAGE, video_token_id=VIDEO,
                         vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)


def qwen_image_batch(seed: int) -> dict:
    """Three images of 4x4, 2x6 and 6x4 patches (4, 3 and 6 tokens after merging), two in row 0, one in
    left-padded row 1; pixel values drawn with ``seed + 1``."""
    grids = torch.tensor([[1, 4, 4], [1, 2, 6], [1, 6, 4]])
    input_ids = text(2, 24, seed=seed)
    for row, start, tokens in ((0, 2, 4), (0, 12, 3), (1, 9, 6)):
        input_ids[row, start:start + tokens + 2] = torch.tensor([VISION_START] + [IMAGE] * tokens + [VISION_END])
    pixel_values = randn(int(grids.prod(-1).sum()), 3 * 2 * 4 * 4, seed=seed + 1)  # channels x time x patch x patch
    return dict(input_ids=input_ids, attention_mask=padding([24, 19], 24, left=True), pixel_values=pixel_values,
                image_grid_thw=grids, mm_token_type_ids=(input_ids == IMAGE).int())


def test_qwen2_vl_images_of_different_sizes_in_one_batch_match_eager():
    """Three images of 4x4, 2x6 and 6x4 patches (4, 3 and 6 tokens after merging), two in row 0, one in
    left-padded row 1. The vision tower packs them by cu_seqlens, and under omni each of its two layers attends
    them in one call, each image alone (Transformers would split them into a call per image)."""
    inputs = qwen_image_batch(seed=8)
    assert_omni_matches(from_config(Qwen2VLForConditionalGeneration, qwen2_vl_config()), inputs,
                        logits_at(inputs["attention_mask"].bool()), {"VisionAttention": 2, "Qwen2VLAttention": 2})


def qwen2_5_vl_config():
    """Qwen2.5-VL at its vision tower's head dim (80: two heads of a 160-wide tower); windows of 2 x 2 merged
    patches in layer 0, full attention over each image in layer 1."""
    vision = dict(depth=2, hidden_size=160, num_heads=2, intermediate_size=96, out_hidden_size=64, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=16, fullatt_block_indexes=[1])
    return Qwen2_5_VLConfig(vision_config=vision, text_config=QWEN_LANGUAGE, image_token_id=IMAGE, video_token_id=VIDEO,
                            vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)


def test_qwen2_5_vl_vision_windows_and_full_layers_run_through_omni_like_sdpa():
    """The same three images as above through Qwen2.5-VL, vision tower included: its windowed layer attends each
    window alone (4 x 4 patches: one window; 2 x 6: two; 6 x 4: two), its full layer each image alone, all
    bidirectional, each layer in one packed call, at head dim 80 (on the 96 kernels on a GPU)."""
    inputs = qwen_image_batch(seed=18)
    assert_omni_matches(from_config(Qwen2_5_VLForConditionalGeneration, qwen2_5_vl_config()), inputs,
                        logits_at(inputs["attention_mask"].bool()),
                        {"Qwen2_5_VLVisionAttention": 2, "Qwen2_5_VLAttention": 2}, reference="sdpa")


def llava_config():
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=16, patch_size=4, projection_dim=32)
    return LlavaConfig(vision_config=vision, text_config=llama_config(), image_token_index=IMAGE,
                       image_seq_length=16)


def test_llava_image_tokens_in_a_left_padded_batch_match_eager():
    """One image (16 patch tokens, the CLS token dropped) per row."""
    input_ids = text(2, 28, seed=10)
    input_ids[0, 4:20], input_ids[1, 10:26] = IMAGE, IMAGE
    attention_mask = padding([28, 20], 28, left=True)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, pixel_values=randn(2, 3, 16, 16, seed=11))
    assert_omni_matches(from_config(LlavaForConditionalGeneration, llava_config()), inputs,
                        logits_at(attention_mask.bool()), {"CLIPAttention": 2, "LlamaAttention": 2})


# ---------------------------------------------------------------------- the newest VLM families


def gemma4_config(window: int = 3, global_head_dim: int = 32, vision_head_dim: int = 16):
    """Sliding layers of ``window`` (3: shorter than an image or a video frame, so the window cuts into them);
    global layers at ``global_head_dim``; a 1-layer vision tower, a 1-layer audio tower (eager-only chunked
    attention)."""
    text_config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=global_head_dim,
                       sliding_window=window, layer_types=["sliding_attention", "full_attention"],
                       hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
                       use_bidirectional_attention="vision", pad_token_id=0)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  head_dim=vision_head_dim,
                  num_key_value_heads=2, patch_size=4, pooling_kernel_size=2, position_embedding_size=64)
    audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, subsampling_conv_channels=[8, 4],
                 output_proj_dims=32, attention_chunk_size=4, attention_context_left=5)
    return Gemma4Config(text_config=text_config, vision_config=vision, audio_config=audio, boi_token_id=BOI,
                        eoi_token_id=EOI, image_token_id=IMAGE, video_token_id=VIDEO, boa_token_id=BOA,
                        eoa_token_index=EOA, audio_token_id=AUDIO, tie_word_embeddings=False)


def gemma4_patches(frames: int, seed: int, width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel patches ``[frames, 4 * width, 48]`` of 4 x ``width`` patches (``width`` tokens after pooling) and their
    (x, y) positions."""
    ys, xs = torch.meshgrid(torch.arange(4), torch.arange(width), indexing="ij")
    positions = torch.stack([xs.flatten(), ys.flatten()], -1)[None].expand(frames, -1, -1)
    return randn(frames, 4 * width, 48, seed=seed), positions


def gemma4_batch(rows: int) -> dict:
    """Row 0: an image of 6 tokens and an audio clip of 4; row 1, padded 4 on the left: a video of two frames (4
    tokens each, a timestamp token between them). ``rows`` 1 keeps row 0 alone."""
    ids = text(2, 30, seed=30)
    ids[0, 2:10] = torch.tensor([BOI] + [IMAGE] * 6 + [EOI])
    ids[0, 12:18] = torch.tensor([BOA] + [AUDIO] * 4 + [EOA])
    ids[1, 5:11] = ids[1, 12:18] = torch.tensor([BOI] + [VIDEO] * 4 + [EOI])
    pixel_values, image_position_ids = gemma4_patches(1, seed=31, width=6)
    inputs = dict(input_ids=ids, attention_mask=padding([30, 26], 30, left=True), pixel_values=pixel_values,
                  image_position_ids=image_position_ids, input_features=randn(1, 16, 8, seed=33),
                  input_features_mask=torch.ones(1, 16, dtype=torch.bool))
    if rows == 2:
        videos, video_position_ids = gemma4_patches(2, seed=32)
        if "num_frames_per_video" in inspect.signature(Gemma4ForConditionalGeneration.forward).parameters:
            inputs |= dict(pixel_values_videos=videos, video_position_ids=video_position_ids,
                           num_frames_per_video=torch.tensor([2]))
        else:  # Transformers 5.9: videos [videos, frames, patches, 48]
            inputs |= dict(pixel_values_videos=videos[None], video_position_ids=video_position_ids[None])
    else:
        inputs |= dict(input_ids=ids[:1], attention_mask=inputs["attention_mask"][:1])
    ids = inputs["input_ids"]
    return inputs | dict(mm_token_type_ids=(ids == IMAGE) * 1 + (ids == VIDEO) * 2 + (ids == AUDIO) * 3)


@contextlib.contextmanager
def mask_paths():
    """Counts the block masks built from a mask spec, by path: "token rule" (recognised) or "tile by tile"."""
    paths = collections.Counter()
    builders = {"token rule": "from_token_ids", "tile by tile": "from_mask_fn"}
    with pytest.MonkeyPatch.context() as patch:
        for path, name in builders.items():
            def counted(*args, _build=getattr(OmniBlockMask, name), _path=path, **kwargs):
                paths[_path] += 1
                return _build(*args, **kwargs)

            patch.setattr(OmniBlockMask, name, counted)
        yield paths


@pytest.mark.parametrize("window", [8, 3], ids=["window-spares-images", "window-cuts-images"])
@pytest.mark.parametrize("rows", [1, 2], ids=["image-and-audio", "left-padded-batch-with-video"])
def test_gemma4_images_video_and_audio_match_eager_with_the_audio_tower_on_its_own_attention(rows, window):
    """Images and video frames bidirectional, cut by the sliding window as Transformers cuts them (window 3 against
    an image of 6 tokens and frames of 4: the token rule with `window_covers_groups`); the audio tower (eager-only)
    keeps its chunked attention and the mask eager gives it, never omni's spec. Per forward, the global layers' mask
    (causal with padding) and the sliding layers' are both the token rule, never tile by tile."""
    inputs = gemma4_batch(rows)
    with mask_paths() as taken:
        assert_omni_matches(from_config(Gemma4ForConditionalGeneration, gemma4_config(window)), inputs,
                            logits_at(inputs["attention_mask"].bool()),
                            {"Gemma4VisionAttention": rows, "Gemma4TextAttention": 2},
                            own={"Gemma4AudioModel": "eager"})
    assert dict(taken) == {"token rule": 2}


def tempered_gemma4(global_head_dim: int, vision_head_dim: int = 16) -> Callable:
    """``build(attn)`` of `gemma4_config` (window 4) whose global layers' query norm is scaled by
    sqrt(32 / global_head_dim). Gemma 4 scales q.k by 1 after RMS-normalising q and k, so its logits spread as
    sqrt(D); at D 512 a softmax that sharp turns float32 rounding into gradient errors of 3e-5, sdpa's against eager
    as large as omni's. Scaled, the logits spread as at D 32 and both stay near 6e-6."""
    config = gemma4_config(4, global_head_dim, vision_head_dim)

    def build(attn):
        model = Gemma4ForConditionalGeneration._from_config(copy.deepcopy(config), attn_implementation=attn)
        with torch.no_grad():
            for module in model.modules():
                if type(module).__name__ == "Gemma4TextAttention" and module.head_dim == global_head_dim:
                    module.q_norm.weight.mul_((32 / global_head_dim) ** 0.5)
        return model

    return build


@ROWS
def test_gemma4_global_layers_at_head_dim_512_build_and_match_eager(rows):
    """Gemma 4's own global head dim, 512, the largest omni takes: built (not refused) and exact."""
    inputs = gemma4_batch(rows)
    assert_omni_matches(tempered_gemma4(512), inputs,
                        logits_at(inputs["attention_mask"].bool()),
                        {"Gemma4VisionAttention": rows, "Gemma4TextAttention": 2}, own={"Gemma4AudioModel": "eager"})


def image_sample(image: list[int], image_key: str, seed: int, before: int, after: int, **vision) -> dict:
    """A sample as a processor gives it: ``before`` text tokens, ``image`` (its tokens), ``after`` text tokens;
    ``image_key`` 1 on the image's ``IMAGE`` tokens, else 0; ``vision``: the image's inputs."""
    ids = torch.cat([text(1, before, seed)[0], torch.tensor(image), text(1, after, seed + 1)[0]])
    return dict(input_ids=ids, **{image_key: (ids == IMAGE).long()}, **vision)


def assert_packed_row_matches_each_sample_alone(build, samples: list[dict], vision: VisionInputs, reaches: dict):
    """``samples`` packed into one row by `OmniCollator` (position ids restarting per sample, ``omni_doc_ids`` /
    ``omni_group_ids``, the vision inputs concatenated) through omni: the logits of each sample, and every parameter's
    gradient of a fixed random linear loss on them, equal eager's for the samples run alone (unpacked, batch 1, no
    mask), to 1e-5 relative error. ``reaches``: the attention calls per module class that reach omni."""
    length = sum(len(sample["input_ids"]) for sample in samples)
    batch = OmniCollator(pad_token_id=0, mode="pack", max_length=length, vision=vision)(samples)
    assert batch["input_ids"].shape == (1, length) and "attention_mask" not in batch
    assert batch["omni_doc_ids"].amax() == len(samples) - 1 and batch["omni_group_ids"].amax() == len(samples) - 1
    omni, ref, _ = models(build, CPU)
    bounds = torch.tensor([0] + [len(sample["input_ids"]) for sample in samples]).cumsum(0).tolist()

    row = {key: value for key, value in batch.items() if key != "labels"}
    with omni_calls() as calls:
        got, grads = outputs_and_grads(omni, row, lambda out: [out.logits[0, a:b] for a, b in zip(bounds, bounds[1:])])
    assert dict(calls) == reaches
    ref.zero_grad()
    expected = [ref(**{key: value[None] if key in vision.token_keys or key == "input_ids" else value
                       for key, value in sample.items()}).logits[0] for sample in samples]
    probe = torch.Generator().manual_seed(7)
    sum((out * torch.randn(out.shape, generator=probe)).sum() for out in expected).backward()
    for i, (out, ref_out) in enumerate(zip(got, expected, strict=True)):
        assert_close_to_reference(out, ref_out.detach(), what=f"sample {i}'s logits")
    ref_grads = {name: p.grad for name, p in ref.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys() and grads
    for name in ref_grads:
        assert_close_to_reference(*(joined_key_bias(g, name) for g in (grads, ref_grads)), what=name)


def test_gemma4_packed_row_from_the_collators_ids_keeps_images_causal_in_its_global_layers_like_each_sample_alone():
    """Gemma 4 attends images both ways in its sliding layers only (Transformers 5.24; 5.9 gives its global layers
    the image blocks too): omni's ids give the global layers no image groups where the model says so, and a packed
    row of two samples, an image (4 tokens, within the window of 4) in each, gives each sample's logits and
    gradients as eager gives them for that sample alone."""
    samples = []
    for i, (before, after) in enumerate([(5, 7), (3, 9)]):
        pixel_values, image_position_ids = gemma4_patches(1, seed=40 + i)
        samples.append(image_sample([BOI] + [IMAGE] * 4 + [EOI], "mm_token_type_ids", 41 + 2 * i, before, after,
                                    pixel_values=pixel_values, image_position_ids=image_position_ids))
    vision = VisionInputs(image_token_ids=(IMAGE,), tokens_per_image=4, image_attention="bidirectional",
                          token_keys=("mm_token_type_ids",), image_keys={"pixel_values": 0, "image_position_ids": 0},
                          count_key="pixel_values")
    assert_packed_row_matches_each_sample_alone(from_config(Gemma4ForConditionalGeneration, gemma4_config(4)),
                                                samples, vision, {"Gemma4VisionAttention": 1, "Gemma4TextAttention": 2})


def test_gemma3_packed_row_from_the_collators_ids_keeps_images_bidirectional_in_every_layer_like_each_sample_alone():
    """Gemma 3 attends images both ways in all its layers: a packed row of two samples from the collator its family
    gives (an image of 9 tokens in each, within the sliding window of 10) gives each sample's logits and gradients as
    eager gives them for that sample alone, its global layers keeping the image groups."""
    config = gemma3_vlm_config()
    config.text_config.sliding_window = 10
    image = [BOI] + [IMAGE] * 9 + [EOI]
    samples = [image_sample(image, "token_type_ids", 50 + 2 * i, before, after,
                            pixel_values=randn(1, 3, 24, 24, seed=60 + i))
               for i, (before, after) in enumerate([(4, 8), (6, 5)])]
    assert_packed_row_matches_each_sample_alone(from_config(Gemma3ForConditionalGeneration, config), samples,
                                                VisionInputs.from_config(config), {"SiglipAttention": 1,
                                                                                   "Gemma3Attention": 2})


ATTENTION_BACKEND_FLAGS = ("_supports_attention_backend", "_supports_sdpa", "_supports_flash_attn",
                           "_supports_flex_attn")


def test_a_tower_whose_attention_never_calls_the_function_keeps_it_though_its_class_claims_every_backend(monkeypatch):
    """Gemma 4's audio tower as Transformers 5.9 declares it (every backend supported, yet its chunked attention never
    calls the attention function): read from its modules once built, it runs eager, at build and when an eager model
    is switched to omni, with eager's mask."""
    for flag in ATTENTION_BACKEND_FLAGS:
        monkeypatch.setattr(Gemma4AudioModel, flag, True)
    inputs = gemma4_batch(1)
    build = from_config(Gemma4ForConditionalGeneration, gemma4_config(4))
    assert_omni_matches(build, inputs, logits_at(inputs["attention_mask"].bool()),
                        {"Gemma4VisionAttention": 1, "Gemma4TextAttention": 2}, own={"Gemma4AudioModel": "eager"})
    switched = build("eager")
    switched.set_attn_implementation("omni")
    assert_implementations(switched, "omni", {"Gemma4AudioModel": "eager"})


def test_gemma4_packed_rows_of_images_under_the_window_match_eager_through_the_token_rule():
    """Two rows of two samples packed by ``position_ids`` (no attention mask, no cache: Transformers packs them), three
    images of 8 tokens against window 3. From 5.24 Transformers reads a packed sample's image ids at positions
    counted from the sample's start, and omni reads them so too; every mask is the token rule."""
    ids = text(2, 30, seed=57)
    ids[0, 2:12] = ids[0, 17:27] = ids[1, 6:16] = torch.tensor([BOI] + [IMAGE] * 8 + [EOI])
    positions = torch.tensor([list(range(14)) + list(range(16)), list(range(20)) + list(range(10))])
    pixel_values, image_position_ids = gemma4_patches(3, seed=58, width=8)
    inputs = dict(input_ids=ids, position_ids=positions, use_cache=False, pixel_values=pixel_values,
                  image_position_ids=image_position_ids, mm_token_type_ids=(ids == IMAGE).long())
    with mask_paths() as taken:
        assert_omni_matches(from_config(Gemma4ForConditionalGeneration, gemma4_config(3)), inputs,
                            logits_at(torch.ones_like(ids, dtype=torch.bool)),
                            {"Gemma4VisionAttention": 1, "Gemma4TextAttention": 2}, own={"Gemma4AudioModel": "eager"})
    assert dict(taken) == {"token rule": 2}


def deepseek_vl_hybrid_config():
    """Llama text, a SigLIP low-resolution tower and a SAM high-resolution tower (windows of 4 patches, layer 1
    global), whose vision layers pick their attention from SAM's own table."""
    language = dict(llama_config().to_dict(), model_type="llama")
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=16, patch_size=4)
    sam = dict(model_type="sam_vision_model", hidden_size=32, output_channels=16, num_hidden_layers=2,
               num_attention_heads=2, image_size=32, patch_size=4, window_size=4, global_attn_indexes=[1], mlp_dim=64,
               num_pos_feats=16)
    return DeepseekVLHybridConfig(text_config=language, vision_config=vision, high_res_vision_config=sam,
                                  image_token_id=IMAGE)


@ROWS
def test_deepseek_vl_hybrid_runs_sam_on_its_own_attention_and_the_rest_on_omni_like_eager(rows):
    """Sixteen image tokens per row, row 1 padded left; SAM's vision layers run sdpa (it has no "omni" entry)."""
    input_ids = text(2, 24, seed=34)
    input_ids[0, 2:18], input_ids[1, 6:22] = IMAGE, IMAGE
    inputs = first_row(dict(input_ids=input_ids, attention_mask=padding([24, 20], 24, left=True),
                            pixel_values=randn(2, 3, 16, 16, seed=35),
                            high_res_pixel_values=randn(2, 3, 32, 32, seed=36)), rows)
    assert_omni_matches(from_config(DeepseekVLHybridForConditionalGeneration, deepseek_vl_hybrid_config()), inputs,
                        logits_at(inputs["attention_mask"].bool()), {"SiglipAttention": 1, "LlamaAttention": 2},
                        own={"SamVisionModel": "sdpa"})


def got_ocr2_config():
    """A Qwen2 language model and GOT-OCR2's (SAM-style) vision encoder, whose attention never calls the attention
    function: 64 px images of 8 px patches, 4 image tokens after the projector's two strided convolutions."""
    vision = dict(hidden_size=32, output_channels=16, num_hidden_layers=1, num_attention_heads=2, image_size=64,
                  patch_size=8, mlp_dim=64, global_attn_indexes=[0])
    return GotOcr2Config(vision_config=vision, text_config=dict(LANGUAGE, model_type="qwen2"), image_token_index=IMAGE)


@ROWS
def test_got_ocr2_runs_its_vision_encoder_on_its_own_attention_and_the_language_model_on_omni_like_eager(rows):
    """Its vision encoder is a tower of its own config that attends on its own: it runs eager, the rest omni."""
    inputs = first_row(image_rows(seed=37) | dict(pixel_values=randn(2, 3, 64, 64, seed=38)), rows)
    assert_omni_matches(from_config(GotOcr2ForConditionalGeneration, got_ocr2_config()), inputs,
                        logits_at(inputs["attention_mask"].bool()), {"Qwen2Attention": 2},
                        own={"GotOcr2VisionEncoder": "eager"})


# The language model of the Qwen3-VL family's tests (interleaved 3-D rope sections of a 16-wide head) and their
# vision tower (patches of 4 px, 2 x 2 merged).
QWEN3_LANGUAGE = dict(QWEN_LANGUAGE, head_dim=16, rope_parameters={
    "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "mrope_interleaved": True})
QWEN3_VISION = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, patch_size=4,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
QWEN3_TOKENS = dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=VISION_START,
                    vision_end_token_id=VISION_END)
LANGUAGE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def qwen3_vl_config():
    return Qwen3VLConfig(vision_config=dict(QWEN3_VISION, deepstack_visual_indexes=[0]), text_config=QWEN3_LANGUAGE,
                         **QWEN3_TOKENS)


def qwen3_vl_moe_config():
    """Two of three experts per token (with one of two, the router's weight is 1 and its gradient rounding noise)."""
    language = dict(QWEN3_LANGUAGE, num_experts=3, num_experts_per_tok=2, moe_intermediate_size=32,
                    decoder_sparse_step=1)
    return Qwen3VLMoeConfig(vision_config=dict(QWEN3_VISION, deepstack_visual_indexes=[0]), text_config=language,
                            **QWEN3_TOKENS)


def qwen3_5_config():
    """A linear-attention (gated delta) layer, which keeps its own attention, then a full-attention layer."""
    language = dict(QWEN3_LANGUAGE, layer_types=["linear_attention", "full_attention"], linear_key_head_dim=8,
                    linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                    rope_parameters=dict(QWEN3_LANGUAGE["rope_parameters"], partial_rotary_factor=1.0))
    return Qwen3_5Config(vision_config=QWEN3_VISION, text_config=language, **QWEN3_TOKENS)


@pytest.mark.parametrize("model_class, config, reaches", [
    (Qwen3VLForConditionalGeneration, qwen3_vl_config, {"Qwen3VLVisionAttention": 2, "Qwen3VLTextAttention": 2}),
    (Qwen3VLMoeForConditionalGeneration, qwen3_vl_moe_config,
     {"Qwen3VLMoeVisionAttention": 2, "Qwen3VLMoeTextAttention": 2}),
    (Qwen3_5ForConditionalGeneration, qwen3_5_config, {"Qwen3_5VisionAttention": 2, "Qwen3_5Attention": 1}),
], ids=["qwen3-vl", "qwen3-vl-moe", "qwen3.5"])
@ROWS
def test_qwen3_vl_family_images_of_different_sizes_match_eager(model_class, config, reaches, rows):
    """The three images of the Qwen2-VL test through Qwen3-VL's packed vision tower (each layer one packed call)."""
    inputs = qwen_rows(qwen_image_batch(seed=40), rows)
    assert_omni_matches(from_config(model_class, config()), inputs, logits_at(inputs["attention_mask"].bool()), reaches)


def qwen3_omni_thinker_config():
    """Qwen3-Omni's thinker: a MoE language model (two of three experts), Qwen3-VL's vision tower and an audio
    encoder (one layer over 32 mel frames: 4 audio tokens)."""
    language = dict(QWEN3_LANGUAGE, num_experts=3, num_experts_per_tok=2, moe_intermediate_size=32,
                    decoder_sparse_step=1)
    audio = dict(num_mel_bins=8, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                 output_dim=64, downsample_hidden_size=8, max_source_positions=64)
    return Qwen3OmniMoeThinkerConfig(audio_config=audio, vision_config=dict(QWEN3_VISION, deepstack_visual_indexes=[0]),
                                     text_config=language, audio_token_id=AUDIO, audio_start_token_id=BOA,
                                     **QWEN3_TOKENS)


@ROWS
def test_qwen3_omni_thinker_images_and_audio_match_eager(rows):
    """The three images of the Qwen2-VL test and, in row 0, an audio clip of 4 tokens."""
    inputs = qwen_image_batch(seed=51)
    inputs.pop("mm_token_type_ids")
    inputs["input_ids"][0, 18:24] = torch.tensor([BOA] + [AUDIO] * 4 + [EOA])
    inputs = qwen_rows(inputs, rows) | dict(input_features=randn(1, 8, 32, seed=52),
                                            feature_attention_mask=torch.ones(1, 32, dtype=torch.long))
    assert_omni_matches(from_config(Qwen3OmniMoeThinkerForConditionalGeneration, qwen3_omni_thinker_config()), inputs,
                        logits_at(inputs["attention_mask"].bool()), {"Qwen3OmniMoeAudioAttention": 1,
                        "Qwen3OmniMoeVisionAttention": 2, "Qwen3OmniMoeThinkerTextAttention": 2})


def molmo2_config():
    """A 2-layer vision tower over crops of 4 x 4 patches, pooled 2 x 2 by a cross-attention (one query per pooled
    token over its patches) into 4 image tokens."""
    vision = dict(TOWER, num_hidden_layers=2, num_key_value_heads=2, head_dim=16, image_size=[16, 16], patch_size=4,
                  num_position_embeddings=16)
    adapter = dict(vision_feature_layer=[-1], hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                   head_dim=16, intermediate_size=64, text_hidden_size=64)
    language = dict(LANGUAGE, additional_vocab_size=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return installed("Molmo2Config")(
        vision_config=vision, adapter_config=adapter, text_config=language, image_patch_id=IMAGE,
        image_start_token_id=BOI, image_end_token_id=EOI, low_res_image_start_token_id=VISION_START,
        frame_start_token_id=VISION_END, frame_end_token_id=VIDEO)


@ROWS
def test_molmo2_pooling_cross_attention_over_padded_patches_matches_eager_and_is_not_built_tile_by_tile(rows):
    """One crop per row; one pooled token of each sees 2 of its 4 patches (the others are padding slots). The
    pooling's mask is the key padding; the language model's the token rule; nothing is evaluated tile by tile."""
    pooling = torch.tensor([[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, -1, -1], [10, 11, 14, 15]])
    inputs = first_row(image_rows(seed=55) | dict(
        pixel_values=randn(2, 16, 48, seed=56), image_grids=torch.tensor([[2, 2, 0, 0], [2, 2, 0, 0]]),
        image_token_pooling=torch.cat([pooling, torch.where(pooling >= 0, pooling + 16, -1)]),
        image_num_crops=torch.tensor([1, 1])), rows, image_token_pooling=pooling)
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == IMAGE).long()
    with mask_paths() as taken:
        assert_omni_matches(from_config(installed("Molmo2ForConditionalGeneration"), molmo2_config()), inputs,
                            logits_at(inputs["attention_mask"].bool()),
                            {"Molmo2VisionAttention": 3, "Molmo2Attention": 2})
    assert dict(taken) == {"token rule": 1}


def forward_runs_here(build, inputs: dict) -> None:
    """Skips, naming the error, where the family's forward fails under eager itself on this Transformers (5.24's
    Llama 4 reads an ``image_outputs`` its language model does not return): nothing of omni's to test there."""
    try:
        with torch.no_grad():
            build("eager")(**inputs)
    except AttributeError as error:
        pytest.skip(f"the forward fails under eager on Transformers {transformers.__version__}: {error}")


def test_molmo2_pooling_in_inference_with_every_slot_real_is_full_not_tile_by_tile():
    """Without autograd an all-real padding mask is dropped at one host sync (as sdpa drops it); the pooling's
    cross-attention (one query over its four patches, none a padding slot) is then every key, implicit, never
    evaluated tile by tile. Logits as eager's."""
    pooling = torch.tensor([[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]])
    inputs = image_rows(seed=59) | dict(
        pixel_values=randn(2, 16, 48, seed=60), image_grids=torch.tensor([[2, 2, 0, 0], [2, 2, 0, 0]]),
        image_token_pooling=torch.cat([pooling, pooling + 16]), image_num_crops=torch.tensor([1, 1]))
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == IMAGE).long()
    omni, ref, _ = models(from_config(installed("Molmo2ForConditionalGeneration"), molmo2_config()), CPU)
    rows = inputs["attention_mask"].bool()
    with torch.no_grad(), mask_paths() as taken:
        got = omni(**inputs).logits[rows]
    with torch.no_grad():
        assert_close_to_reference(got, ref(**inputs).logits[rows])
    assert dict(taken) == {"token rule": 1}  # the language model's (padded rows); nothing tile by tile


def image_rows(seed: int, tokens: int = 4) -> dict:
    """Batch 2 of 24 tokens, ``tokens`` image tokens in each row, row 1 padded 4 on the left."""
    input_ids = text(2, 24, seed=seed)
    input_ids[0, 2:2 + tokens], input_ids[1, 8:8 + tokens] = IMAGE, IMAGE
    return dict(input_ids=input_ids, attention_mask=padding([24, 20], 24, left=True))


@pytest.mark.parametrize("model_name, config, pixels, reaches", [
    ("Mistral3ForConditionalGeneration",
     lambda: Mistral3Config(vision_config=dict(TOWER, image_size=16, patch_size=4, head_dim=16),
                            text_config=dict(LANGUAGE, model_type="mistral"), image_token_index=IMAGE,
                            spatial_merge_size=2),
     lambda: dict(pixel_values=randn(2, 3, 16, 16, seed=42), image_sizes=torch.tensor([[16, 16], [16, 16]])),
     {"PixtralAttention": 1, "MistralAttention": 2}),
    ("Idefics3ForConditionalGeneration",
     lambda: Idefics3Config(vision_config=dict(TOWER, image_size=16, patch_size=4),
                            text_config=dict(LANGUAGE, model_type="llama"), image_token_id=IMAGE, scale_factor=2),
     lambda: dict(pixel_values=randn(2, 1, 3, 16, 16, seed=44)), {"Idefics3VisionAttention": 1, "LlamaAttention": 2}),
    ("InternVLForConditionalGeneration",
     lambda: InternVLConfig(vision_config=dict(TOWER, image_size=[16, 16], patch_size=[4, 4]),
                            text_config=dict(LANGUAGE, model_type="qwen2"), image_token_id=IMAGE,
                            downsample_ratio=0.5),
     lambda: dict(pixel_values=randn(2, 3, 16, 16, seed=46)), {"InternVLVisionAttention": 1, "Qwen2Attention": 2}),
    ("Llama4ForConditionalGeneration",
     lambda: Llama4Config(vision_config=dict(TOWER, intermediate_size=128, image_size=16, patch_size=4,
                                             vision_output_dim=32, projector_input_dim=32, projector_output_dim=32,
                                             pixel_shuffle_ratio=0.5),
                          text_config=llama4_config().to_dict(), image_token_index=IMAGE, boi_token_index=BOI,
                          eoi_token_index=EOI),
     lambda: dict(pixel_values=randn(2, 3, 16, 16, seed=48)), {"Llama4VisionAttention": 1, "Llama4TextAttention": 2}),
    ("HunYuanVLForConditionalGeneration",
     lambda: installed("HunYuanVLConfig")(
         vision_config=dict(TOWER, patch_size=4, spatial_merge_size=2, temporal_patch_size=1, text_hidden_size=64,
                            out_hidden_size=64),
         text_config=dict(LANGUAGE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "mrope_section": [2, 2, 2, 2]}),
         image_token_id=IMAGE, im_start_id=BOI, im_end_id=EOI, im_newline_id=VISION_END),
     lambda: dict(pixel_values=randn(32, 48, seed=54), image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 4]])),
     {"HunYuanVLVisionAttention": 1, "HunYuanVLDenseV1Attention": 2}),
], ids=["mistral3-pixtral", "idefics3-smolvlm", "internvl", "llama4", "hunyuan-vl"])
@ROWS
def test_vlms_with_a_tower_per_image_match_eager(model_name, config, pixels, reaches, rows):
    """One image of 16 patches per row (4 tokens after merging; HunYuanVL: 8, with row ends and bounds), row 1
    left-padded."""
    model_class = installed(model_name)
    hunyuan = model_name == "HunYuanVLForConditionalGeneration"
    inputs = image_rows(seed=41, tokens=8 if hunyuan else 4) | pixels()
    inputs = first_row(inputs, rows, **({"pixel_values": inputs["pixel_values"][:16]} if hunyuan else {}))
    if hunyuan:  # its multimodal rope reads the image tokens' places
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == IMAGE).int()
    build = from_config(model_class, config())
    forward_runs_here(build, inputs)
    assert_omni_matches(build, inputs, logits_at(inputs["attention_mask"].bool()), reaches)


# ---------------------------------------------------------------------- encoders


def tower(**extra) -> dict:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, **extra)


def text_tower() -> dict:
    return tower(vocab_size=VOCAB, max_position_embeddings=16, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.mark.parametrize("model_class, config, attention", [
    (CLIPModel, lambda: CLIPConfig(text_config=text_tower(), vision_config=tower(image_size=16, patch_size=4),
                                   projection_dim=16), "CLIPAttention"),
    (SiglipModel, lambda: SiglipConfig(text_config=text_tower(), vision_config=tower(image_size=16, patch_size=4)),
     "SiglipAttention"),
], ids=["clip", "siglip"])
def test_clip_and_siglip_text_and_vision_towers_match_eager(model_class, config, attention):
    """The vision towers attend bidirectionally with no mask; the text towers (CLIP causal, SigLIP
    bidirectional) get rows padded right, not at all, and left."""
    input_ids = text(3, 16, seed=12)
    attention_mask = torch.cat([padding([11, 16], 16, left=False), padding([9], 16, left=True)])
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, pixel_values=randn(2, 3, 16, 16, seed=13))
    rows = attention_mask.bool()
    assert_omni_matches(from_config(model_class, config()), inputs, lambda out: [
        out.text_model_output.last_hidden_state[rows], out.vision_model_output.last_hidden_state], {attention: 4})


def test_bert_bidirectional_encoder_with_padding_matches_eager():
    """Rows padded right, not at all, and left, with two token-type segments."""
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    input_ids = text(3, 16, seed=14)
    attention_mask = torch.cat([padding([10, 16], 16, left=False), padding([7], 16, left=True)])
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask,
                  token_type_ids=(torch.arange(16) >= 6).long().expand(3, -1))
    rows = attention_mask.bool()
    assert_omni_matches(from_config(BertModel, config), inputs, lambda out: [out.last_hidden_state[rows]],
                        {"BertSelfAttention": 2})


def test_modernbert_local_and_global_bidirectional_layers_with_padding_match_eager():
    """Layer 0 attends globally, layers 1 and 2 within 2 tokens either side (local_attention 4)."""
    config = ModernBertConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, local_attention=4, global_attn_every_n_layers=3,
                              max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              cls_token_id=1, sep_token_id=2)
    attention_mask = torch.cat([padding([10, 16], 16, left=False), padding([7], 16, left=True)])
    rows = attention_mask.bool()
    assert_omni_matches(from_config(ModernBertModel, config), dict(input_ids=text(3, 16, seed=18),
                        attention_mask=attention_mask), lambda out: [out.last_hidden_state[rows]],
                        {"ModernBertAttention": 3})


@pytest.mark.parametrize("decoder_len", [10, 12], ids=["shorter-decoder", "equal-lengths"])
def test_bart_cross_attention_over_a_padded_encoder_batch_matches_eager(decoder_len):
    """Encoder and decoder rows padded right and left: the cross-attention mask hides the encoder's padding. With
    equal lengths a decoder row at an encoder padding position must still see the encoder (it was zeroed once:
    the token rule read the query's padding from the keys)."""
    config = BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    encoder_mask = torch.cat([padding([9], 12, left=False), padding([7], 12, left=True)])
    decoder_mask = torch.cat([padding([7], decoder_len, left=False),
                              padding([decoder_len - 2], decoder_len, left=True)])
    inputs = dict(input_ids=text(2, 12, seed=19), attention_mask=encoder_mask,
                  decoder_input_ids=text(2, decoder_len, seed=20), decoder_attention_mask=decoder_mask)
    assert_omni_matches(from_config(BartForConditionalGeneration, config), inputs, lambda out: [
        out.logits[decoder_mask.bool()], out.encoder_last_hidden_state[encoder_mask.bool()]], {"BartAttention": 2 * 3})


def test_whisper_encoder_decoder_self_and_cross_attention_match_eager():
    """Per layer: encoder self-attention (no mask), decoder causal self-attention (rows padded right and left)
    and cross-attention over the encoder's 12 frames."""
    config = WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, max_source_positions=12, max_target_positions=32, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, decoder_start_token_id=3, begin_suppress_tokens=None)
    decoder_mask = torch.cat([padding([7], 10, left=False), padding([8], 10, left=True)])
    inputs = dict(input_features=randn(2, 8, 2 * 12, seed=15), decoder_input_ids=text(2, 10, seed=16),
                  decoder_attention_mask=decoder_mask)
    rows = decoder_mask.bool()
    assert_omni_matches(from_config(WhisperForConditionalGeneration, config), inputs,
                        lambda out: [out.logits[rows], out.encoder_last_hidden_state], {"WhisperAttention": 2 * 3})


# ---------------------------------------------------------------------- additive position biases


def served_here(build) -> None:
    """Skips, naming the refusal, where omni refuses the model at build on this Transformers: its layers attend on
    their own (T5-style models before Transformers 5.13 never call the attention function;
    `test_a_whole_model_that_keeps_its_own_attention_is_refused_naming_the_implementation_to_pass`)."""
    try:
        build("omni")
    except ValueError as error:
        if "keeps attention of its own" not in str(error):
            raise
        pytest.skip(f"Transformers {transformers.__version__}: {error}")


def t5_config():
    """2 encoder and 2 decoder layers; T5's relative position bias (8 buckets up to distance 16), computed by the first
    layer of each stack and shared by the others; cross-attention gets a zero bias. T5 does not scale q.k."""
    return T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                    relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def encoder_decoder_masks(rows: int, encoder_len: int, decoder_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row unpadded, or a second row with its encoder input padded on the left and its decoder input on the
    right."""
    encoder = [padding([encoder_len], encoder_len, left=False), padding([encoder_len - 4], encoder_len, left=True)]
    decoder = [padding([decoder_len], decoder_len, left=False), padding([decoder_len - 3], decoder_len, left=False)]
    return torch.cat(encoder[:rows]), torch.cat(decoder[:rows])


def assert_relative_bias_learns(grads: dict[str, torch.Tensor], count: int):
    """The relative position bias tables got a gradient (through the op's bias gradient; its value is checked against
    eager's with every other gradient)."""
    tables = {name: g for name, g in grads.items() if name.endswith("relative_attention_bias.weight")}
    assert len(tables) == count and all(g.abs().sum() > 0 for g in tables.values()), tables.keys()


@pytest.mark.parametrize("rows", [1, 2], ids=["one row", "padded batch of two"])
def test_t5_relative_position_bias_matches_eager_with_its_gradient(rows):
    """Encoder self-attention and decoder self-attention with T5's relative position bias (a [1, H, Sq, Skv] view of
    an embedding, last-dim stride H), cross-attention with a zero bias, scale 1.0: logits, the encoder's states and
    every gradient, the bias tables' included, as eager's."""
    build = from_config(T5ForConditionalGeneration, t5_config())
    served_here(build)
    encoder_mask, decoder_mask = encoder_decoder_masks(rows, 12, 10)
    inputs = dict(input_ids=text(rows, 12, seed=21), attention_mask=encoder_mask,
                  decoder_input_ids=text(rows, 10, seed=22), decoder_attention_mask=decoder_mask)
    assert all(layer.SelfAttention.scaling == 1.0 for layer in build("eager").modules()
               if type(layer).__name__ == "T5LayerSelfAttention")
    grads = assert_omni_matches(build, inputs, lambda out: [
        out.logits[decoder_mask.bool()], out.encoder_last_hidden_state[encoder_mask.bool()]], {"T5Attention": 3 * 2})
    assert_relative_bias_learns(grads, 2)


def test_t5_scale_and_bias_reach_the_op():
    """omni honours the scale T5 passes (1.0, not D ** -0.5) and its bias: a model whose scores ignored either
    would not match eager (checked above); here the op sees them."""
    served_here(from_config(T5ForConditionalGeneration, t5_config()))
    seen = []

    def spy(module, query, key, value, mask, scaling=None, **kwargs):
        seen.append((scaling, kwargs.get("position_bias")))
        return omni_attention_forward(module, query, key, value, mask, scaling=scaling, **kwargs)

    omni, _, _ = models(from_config(T5ForConditionalGeneration, t5_config()), CPU)
    AttentionInterface.register("omni", spy)
    try:
        omni(input_ids=text(1, 12, seed=23), decoder_input_ids=text(1, 10, seed=24))
    finally:
        omni_hf.register()
    assert len(seen) == 6 and all(scaling == 1.0 for scaling, _ in seen)
    bias = seen[0][1]
    assert bias.shape == (1, 2, 12, 12) and bias.stride(-1) == 2 and bias.requires_grad


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_t5_greedy_generate_over_a_padded_encoder_batch_is_token_equal(cache):
    """10 new tokens from a padded batch of two (weights 3x the default scale, so that no row repeats one token). The
    static cache's keys fill its slots from the front, so omni reorders them to end the buffer, and the decoder's
    bias (computed over the slots) with them."""
    config = t5_config()
    served_here(from_config(T5ForConditionalGeneration, config))
    config.initializer_factor = 3.0
    inputs = dict(input_ids=text(2, 12, seed=21), attention_mask=encoder_decoder_masks(2, 12, 10)[0])
    assert_greedy_generation_token_equal(from_config(T5ForConditionalGeneration, config), inputs, "eager", cache)


def pix2struct_config():
    """A 2-layer vision encoder over 16 patches of 12 values and a 2-layer T5-style text decoder with a relative
    position bias (self-attention) and cross-attention."""
    text_config = dict(vocab_size=VOCAB, hidden_size=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                       relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0)
    vision = dict(hidden_size=32, patch_embed_hidden_size=12, d_ff=64, d_kv=16, num_hidden_layers=2,
                  num_attention_heads=2, seq_len=16, dropout_rate=0.0)
    return Pix2StructConfig(text_config=text_config, vision_config=vision)


@pytest.mark.parametrize("rows", [1, 2], ids=["one row", "padded batch of two"])
def test_pix2struct_relative_position_bias_matches_eager_with_its_gradient(rows):
    """Flattened patches (row and column ids first) with their padding mask; the decoder's self-attention with its
    relative position bias and cross-attention over the patches: logits, the encoder's states and every gradient."""
    build = from_config(Pix2StructForConditionalGeneration, pix2struct_config())
    served_here(build)
    patch_mask, decoder_mask = encoder_decoder_masks(rows, 16, 10)
    patch_mask = patch_mask.flip(-1)  # patches pad at the end, as the processor does
    patches = randn(rows, 16, 2 + 12, seed=31)
    patches[..., 0], patches[..., 1] = torch.arange(16) // 4 + 1, torch.arange(16) % 4 + 1
    inputs = dict(flattened_patches=patches * patch_mask[..., None], attention_mask=patch_mask,
                  decoder_input_ids=text(rows, 10, seed=32), decoder_attention_mask=decoder_mask)
    grads = assert_omni_matches(build, inputs,
                                lambda out: [out.logits[decoder_mask.bool()],
                                             out.encoder_last_hidden_state[patch_mask.bool()]],
                                {"Pix2StructVisionAttention": 2, "Pix2StructTextAttention": 2 * 2})
    assert_relative_bias_learns(grads, 1)


def udop_config():
    """A 2-layer encoder over 12 text tokens and the 16 patches of a 16 px image, with T5's relative position bias
    plus UDOP's 2D one (horizontal and vertical distances of the tokens' boxes), and a 2-layer decoder."""
    return UdopConfig(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                      dropout_rate=0.0, image_size=16, patch_size=4, num_channels=3, pad_token_id=0, eos_token_id=1,
                      decoder_start_token_id=0)


@ROWS
def test_udop_1d_and_2d_position_biases_match_eager_with_their_gradients(rows):
    """Text with its layout boxes and an image: the encoder's self-attention carries T5's and UDOP's 2D bias (as
    ``position_bias``) over text and patches, the decoder's its own; cross-attention over the padded encoder. Logits,
    the encoder's states and every gradient, the bias tables' included, as eager's."""
    build = from_config(UdopForConditionalGeneration, udop_config())
    served_here(build)
    encoder_mask, decoder_mask = encoder_decoder_masks(rows, 12, 10)
    corner = torch.rand(rows, 12, 2, generator=torch.Generator().manual_seed(25)) * 0.8
    inputs = dict(input_ids=text(rows, 12, seed=26), attention_mask=encoder_mask,
                  bbox=torch.cat([corner, corner + 0.2], -1), pixel_values=randn(rows, 3, 16, 16, seed=27),
                  decoder_input_ids=text(rows, 10, seed=28), decoder_attention_mask=decoder_mask)
    encoder_rows = torch.cat([encoder_mask, torch.ones(rows, 16, dtype=encoder_mask.dtype)], 1).bool()  # + patches
    grads = assert_omni_matches(build, inputs, lambda out: [out.logits[decoder_mask.bool()],
                                                            out.encoder_last_hidden_state[encoder_rows]],
                                {"UdopAttention": 3 * 2})
    tables = {name: g for name, g in grads.items() if "relative" in name and name.endswith("bias.weight")}
    assert len(tables) >= 2 and all(g.abs().sum() > 0 for g in tables.values()), tables.keys()


# ---------------------------------------------------------------------- refusals


def gemma4_audio_config():
    return gemma4_config().audio_config


@pytest.mark.parametrize("model_class, config, claims_every_backend, instead", [
    (FalconForCausalLM, lambda: FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2), False, "sdpa"),
    (Gemma4AudioModel, gemma4_audio_config, False, "eager"),
    (Gemma4AudioModel, gemma4_audio_config, True, "eager"),
], ids=["falcon-own-table", "gemma4-audio-eager-only", "gemma4-audio-claiming-every-backend"])
def test_a_whole_model_that_keeps_its_own_attention_is_refused_naming_the_implementation_to_pass(
        model_class, config, claims_every_backend, instead, monkeypatch):
    """Falcon picks its attention classes from its own table; Gemma 4's audio tower runs its own chunked attention,
    whether its class says so (eager only) or claims every backend (as in Transformers 5.9: read from its modules
    once built). As towers they would run their own; as whole models, refused."""
    for flag in ATTENTION_BACKEND_FLAGS if claims_every_backend else ():
        monkeypatch.setattr(model_class, flag, True)
    with pytest.raises(ValueError, match=rf'attn_implementation="omni": {model_class.__name__} keeps attention of its '
                                         rf'own .*; use attn_implementation="{instead}"'):
        model_class._from_config(config(), attn_implementation="omni")


@pytest.mark.parametrize("tower, head_dims, refused, instead", [
    ("Gemma4TextModel", (520, 16), "full_attention layers at head dim 520", "text_config"),
    ("Gemma4VisionModel", (32, 12), "attention layers at head dim 12", "vision_config"),
], ids=["text-head-dim-above-512", "vision-head-dim-not-a-multiple-of-8"])
def test_a_tower_omni_cannot_serve_is_refused_naming_its_sub_config_and_the_dict_that_builds(tower, head_dims, refused,
                                                                                              instead):
    """The refusal names the tower, the layer type and head dim, and the ``attn_implementation`` dict that gives that
    sub-config sdpa and every other one omni; built with that dict, the model matches eager with the tower on sdpa."""
    build = tempered_gemma4(*head_dims)
    with pytest.raises(ValueError) as refusal:
        build("omni")
    match = re.fullmatch(rf'attn_implementation="omni": {tower} has {refused}; omni attention runs head dims that are '
                         rf'multiples of 8 up to 512; its sub-config {instead} cannot run omni: build '
                         rf'Gemma4ForConditionalGeneration with attn_implementation=(\{{.*\}})', str(refusal.value))
    assert match, refusal.value
    chosen = json.loads(match.group(1))
    assert chosen == {"": "omni", "text_config": "omni", "vision_config": "omni", "audio_config": "omni"} | {
        instead: "sdpa"}
    inputs = gemma4_batch(1)
    reaches = {"Gemma4VisionAttention": 1, "Gemma4TextAttention": 2}
    reaches.pop("Gemma4TextAttention" if instead == "text_config" else "Gemma4VisionAttention")
    assert_omni_matches(lambda attn: build(chosen if attn == "omni" else attn), inputs,
                        logits_at(inputs["attention_mask"].bool()), reaches,
                        own={"Gemma4AudioModel": "eager", tower: "sdpa"})


@pytest.mark.parametrize("name, value, feature", [
    ("s_aux", torch.zeros(2), r"attention sinks \(`s_aux`\)"),
    ("position_bias", torch.zeros(1, 2, 6, 6), r"an additive position bias \(`position_bias`, as in T5\)"),
], ids=["sinks", "position bias"])
def test_context_parallel_refuses_what_it_cannot_honour_yet(name, value, feature):
    """Sinks and position biases run on one rank, not yet on a shard of a row: refused before any ring runs."""
    q = torch.randn(1, 2, 6, 16)
    with pytest.raises(ValueError, match=rf"omni_context_parallel: {feature} (is|are) not supported under context "
                                         rf"parallelism yet"):
        omni_attention_forward(torch.nn.Module(), q, q, q, None, omni_context_parallel=object(), **{name: value})
