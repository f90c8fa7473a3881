"""attn_implementation="omni" in Transformers: the same masks, logits, gradients and tokens as eager / sdpa.

Every test runs on the CPU (float32, the exact reference backend) and, when there is a GPU, on it (bf16, the
CUDA kernels). float32 must match the reference implementation to 1e-5 relative error; bf16 is compared with
a float32 reference and may be at most twice as far from it as the reference implementation itself is in bf16.
"""

import ast
import copy
import dataclasses
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from transformers import (
    AttentionInterface,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Gemma3Config,
    Gemma3TextConfig,
    Gemma4TextConfig,
    LlamaConfig,
    PreTrainedModel,
    Qwen2_5_VLVisionConfig,
    Qwen2Config,
    Qwen2VLVisionConfig,
    SiglipVisionConfig,
)
from transformers import masking_utils as hf_masks
from transformers.cache_utils import DynamicCache, StaticCache
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen2_5_vl_vision
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl_vision
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

import omni_hf
from omni_hf import OmniBlockMask
from omni_hf.integrations.transformers import OmniMaskSpec, omni_attention_forward, omni_mask, patches
from omni_hf.integrations.transformers.layer_mask import block_mask_from_spec
from omni_hf.integrations.transformers.packed_towers import PACKED
from omni_hf.ops.attention import MAX_HEAD_DIM
from tests.helpers.brute_force import naive_attention, relative_error, token_rule_dense
from tests.helpers.model_checks import assert_close_to_reference, low_precision, models, padding

VOCAB, SEQ = 100, 24
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


# ---------------------------------------------------------------------- models


def llama_config(**overrides):
    return LlamaConfig(**{"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                          "max_position_embeddings": 256, **overrides})


def qwen2_config():
    return Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                       use_sliding_window=True, sliding_window=5, layer_types=["sliding_attention", "full_attention"])


def gemma3_text_config(**overrides):
    return Gemma3TextConfig(**{"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "head_dim": 64, "max_position_embeddings": 256, "sliding_window": 5,
                               "layer_types": ["sliding_attention", "full_attention"], **overrides})


BOI, EOI, IMAGE = 97, 98, 99


def gemma3_vlm_config():
    vision = SiglipVisionConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=4)
    return Gemma3Config(text_config=gemma3_text_config(), vision_config=vision, mm_tokens_per_image=4,
                        image_token_index=IMAGE, boi_token_index=BOI, eoi_token_index=EOI)


def causal_lm(config):
    return lambda attn: AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attn)


def logits_and_grads(model, inputs, forward=None):
    """Logits (float32) and parameter gradients of the LM loss; ``forward`` runs ``model`` (e.g. compiled)."""
    if model is None:
        return None, None
    model.zero_grad()
    out = (model if forward is None else forward)(**inputs)
    out.loss.backward()
    return out.logits.float(), {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_logits_and_grads(omni, ref, lowp, rows, inputs, ref_inputs=None, omni_forward=None):
    """Logits at ``rows`` (bool [B, S]) and every parameter gradient of omni against the reference, which gets
    ``ref_inputs`` (default ``inputs``)."""
    ref_inputs = inputs if ref_inputs is None else ref_inputs
    logits, grads = logits_and_grads(omni, inputs, omni_forward)
    (ref_logits, ref_grads), (lowp_logits, lowp_grads) = (logits_and_grads(m, ref_inputs) for m in (ref, lowp))
    assert_close_to_reference(logits[rows], ref_logits[rows], None if lowp is None else lowp_logits[rows], "logits")
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        assert_close_to_reference(grads[name], ref_grads[name], None if lowp is None else lowp_grads[name], name)


def tokens(batch, length, seed=1, device="cpu"):
    return torch.randint(0, IMAGE - 3, (batch, length), generator=torch.Generator().manual_seed(seed)).to(device)


def labels_of(input_ids, attention_mask):
    """LM labels without padding, nor the first token after left padding: a padding position predicts it, and
    rows of padding tokens are arbitrary (eager averages every key there; sdpa and omni give zeros)."""
    after_padding = torch.nn.functional.pad(attention_mask[:, :-1], (1, 0), value=1) == 0
    return input_ids.masked_fill((attention_mask == 0) | after_padding, -100)


# ---------------------------------------------------------------------- registration and policies


def test_import_registers_omni_in_both_interfaces_and_register_is_idempotent():
    for _ in range(2):
        assert AttentionInterface()["omni"] is omni_attention_forward
        assert hf_masks.AttentionMaskInterface()["omni"] is omni_mask
        omni_hf.register()


# The integration's modules in the one direction a call takes (inputs -> mask spec -> block mask -> op); each may
# import only modules after it.
IMPORT_ORDER = ["__init__", "attention", "layer_mask", "recognition", "spec"]


def test_the_integration_imports_one_way_from_the_attention_function_to_the_spec():
    """Imports inside functions included: a module imports none before it in the order of a call, nor itself."""
    package = pathlib.Path(omni_hf.__file__).parent / "integrations" / "transformers"
    for name in IMPORT_ORDER:
        tree = ast.parse((package / f"{name}.py").read_text())
        imported = {node.module.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module}
        earlier = set(IMPORT_ORDER[:IMPORT_ORDER.index(name) + 1])
        assert not imported & earlier, f"{name}.py imports {sorted(imported & earlier)}"


def vision_attention_forwards() -> dict[type, object]:
    """The forward of each packed vision tower's attention class of Qwen2-VL and Qwen2.5-VL, as it is now."""
    classes = (qwen2_vl_vision.VisionAttention, qwen2_5_vl_vision.Qwen2_5_VLVisionAttention)
    return {cls: cls.forward for cls in classes}


def test_patches_touch_only_models_that_choose_omni_and_register_without_patches_removes_them():
    """Transformers' build check and post-build hook are wrapped, and packed towers' forwards only once a model of
    theirs chooses omni; ``register(patch=False)`` restores all (the attention function still refuses what the build
    check would)."""
    original_check = PreTrainedModel.get_correct_attn_implementation
    try:
        omni_hf.register(patch=False)
        plain_check, plain_forwards = PreTrainedModel.get_correct_attn_implementation, vision_attention_forwards()
        plain_post_init = PreTrainedModel.post_init
        assert not patches.installed() and not hasattr(plain_check, "omni_original")
        assert not hasattr(plain_post_init, "omni_original")
        omni_hf.register()
        assert patches.installed() and PreTrainedModel.get_correct_attn_implementation.omni_original is plain_check
        assert PreTrainedModel.post_init.omni_original is plain_post_init

        def build(attn):
            return Qwen2VisionTransformerPretrainedModel._from_config(qwen_vision_config("qwen2_vl"),
                                                                      attn_implementation=attn)

        build("sdpa")
        assert vision_attention_forwards() == plain_forwards  # a model that does not choose omni: untouched
        build("omni")
        wrapped = vision_attention_forwards()
        assert wrapped[qwen2_vl_vision.VisionAttention].__wrapped__ is plain_forwards[qwen2_vl_vision.VisionAttention]
        omni_hf.register(patch=False)
        assert vision_attention_forwards() == plain_forwards
        assert PreTrainedModel.get_correct_attn_implementation is plain_check
        assert PreTrainedModel.post_init is plain_post_init
        model = AutoModelForCausalLM.from_config(llama_config(head_dim=12), attn_implementation="omni")  # no check
        with pytest.raises(ValueError, match=r"q: expected a head dim that is a multiple of 8"):
            model(tokens(1, 8))
    finally:
        omni_hf.register()
    assert PreTrainedModel.get_correct_attn_implementation.omni_original is original_check.omni_original


def test_the_environment_variable_opts_out_of_the_patches_at_import():
    script = ("import omni_hf; from omni_hf.integrations.transformers import patches; "
              "from transformers import AttentionInterface; print(patches.installed(), 'omni' in AttentionInterface())")
    for value, expected in (("1", "False True"), ("0", "True True")):
        env = {**os.environ, "OMNI_HF_NO_PATCH": value, "PYTHONPATH": str(pathlib.Path(omni_hf.__file__).parents[1])}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.split() == expected.split(), done.stderr


@pytest.mark.parametrize("config, refused", [
    (lambda: llama_config(head_dim=12), "attention layers at head dim 12"),
    (lambda: llama_config(head_dim=MAX_HEAD_DIM + 8), f"attention layers at head dim {MAX_HEAD_DIM + 8}"),
    (lambda: gemma3_text_config(head_dim=20), "sliding_attention layers at head dim 20, full_attention layers at "
                                              "head dim 20"),
    (lambda: Gemma4TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              global_head_dim=MAX_HEAD_DIM * 2, layer_types=["sliding_attention", "full_attention"],
                              hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB),
     f"full_attention layers at head dim {MAX_HEAD_DIM * 2}"),
], ids=["not-a-multiple-of-8", "above-the-kernels", "gemma3-both-layer-types", "gemma4-global-layers"])
def test_head_dims_the_op_refuses_are_refused_when_the_model_is_built_naming_the_layer_type(config, refused):
    """Not at the first forward under the name `q`; the largest head dim the op takes builds (read from the op)."""
    message = (rf'attn_implementation="omni": \w+ has {refused}; omni attention runs head dims that are multiples '
               rf'of 8 up to {MAX_HEAD_DIM}; use attn_implementation="sdpa"')
    with pytest.raises(ValueError, match=message):
        AutoModelForCausalLM.from_config(config(), attn_implementation="omni")
    AutoModelForCausalLM.from_config(config(), attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(llama_config(head_dim=MAX_HEAD_DIM), attn_implementation="omni")
    assert model.config._attn_implementation == "omni"


def test_attention_dropout_raises_and_output_attentions_warns(caplog):
    model = AutoModelForCausalLM.from_config(llama_config(attention_dropout=0.1), attn_implementation="omni")
    input_ids = tokens(1, 8)
    with pytest.raises(ValueError, match="dropout"):
        model.train()(input_ids)
    out = model.eval()(input_ids, output_attentions=True)
    assert "does not return attention weights" in caplog.text
    assert all(a is None for a in out.attentions)


# ---------------------------------------------------------------------- what a user passes, and models served


def _ids(rows, fill=0, dtype=torch.int64):
    return torch.full((rows, 10), fill, dtype=dtype)


def _with(ids, index, value):
    ids = ids.clone()
    ids[index] = value
    return ids


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(omni_doc_ids=_ids(2)[:, :8]), ValueError,
     r"omni_doc_ids: expected one id per key, shape \[B, kv_len=10\] \(the tokens of input_ids and any cached before "
     r"them\), got shape \[2, 8\]"),
    (dict(omni_group_ids=_ids(2, -1)[:, :9]), ValueError,
     r"omni_group_ids: expected one id per key.* got shape \[2, 9\]"),
    (dict(omni_doc_ids=_ids(3)), ValueError,
     r"omni_doc_ids: expected batch 1 or 2 \(that of input_ids\), got shape \[3, 10\]"),
    (dict(omni_doc_ids=_ids(2).float()), TypeError, r"omni_doc_ids: expected integer ids .*torch.float32"),
    (dict(omni_doc_ids=_with(_ids(2), (1, 7), -5)), ValueError,
     r"omni_doc_ids: expected ids >= -1 \(-1 = padding\), got -5 at \[1, 7\]"),
    (dict(omni_doc_ids=_ids(2), omni_group_ids=_with(_ids(2, -1), (0, 4), -3)), ValueError,
     r"omni_group_ids: expected ids >= -1 \(-1 = causal text\), got -3 at \[0, 4\]"),
    (dict(omni_block_mask=OmniBlockMask.causal(8)), ValueError,
     r"omni_block_mask: expected q_len=10, kv_len=10 .*got q_len=8, kv_len=8"),
    (dict(omni_block_mask=OmniBlockMask.from_token_ids(_ids(3))), ValueError,
     r"omni_block_mask: expected batch 1 or 2 \(that of input_ids\), got 3"),
    (dict(omni_block_mask=_ids(2)), TypeError, r"omni_block_mask: expected an OmniBlockMask, got Tensor"),
], ids=["doc-short", "group-short", "doc-batch", "doc-float", "doc-below", "group-below", "mask-lengths",
        "mask-batch", "mask-type"])
def test_mask_kwargs_errors_name_the_kwarg_what_was_expected_and_received(kwargs, error, message):
    model = AutoModelForCausalLM.from_config(llama_config(), attn_implementation="omni").eval()
    with torch.no_grad(), pytest.raises(error, match=message):
        model(tokens(2, 10), **kwargs)


def test_token_id_kwargs_given_as_lists_are_converted():
    model = AutoModelForCausalLM.from_config(llama_config(), attn_implementation="omni").eval()
    doc, grp, position_ids = interleaved_ids("cpu")
    input_ids = tokens(2, SEQ)
    with torch.no_grad():
        as_tensors = model(input_ids, position_ids=position_ids, omni_doc_ids=doc, omni_group_ids=grp).logits
        as_lists = model(input_ids, position_ids=position_ids, omni_doc_ids=doc.tolist(),
                         omni_group_ids=grp.tolist()).logits
    assert torch.equal(as_lists, as_tensors)


@pytest.mark.parametrize("build", [causal_lm(llama_config()), causal_lm(gemma3_text_config()),
                                   lambda attn: AutoModelForImageTextToText.from_config(gemma3_vlm_config(),
                                                                                        attn_implementation=attn)],
                         ids=["llama", "gemma3-text", "gemma3-vlm"])
def test_models_omni_serves_build_with_it(build):
    assert build("omni").config.get_text_config()._attn_implementation == "omni"


# ---------------------------------------------------------------------- models against eager / sdpa


def test_llama_gqa_with_left_and_right_padding_matches_eager(device):
    omni, ref, lowp = models(causal_lm(llama_config()), device)
    input_ids = tokens(3, SEQ, device=device)
    attention_mask = torch.cat([padding([17, 24], SEQ, left=True), padding([20], SEQ, left=False)]).to(device)
    assert_same_logits_and_grads(omni, ref, lowp, attention_mask.bool(), dict(
        input_ids=input_ids, attention_mask=attention_mask, labels=labels_of(input_ids, attention_mask)))


def test_qwen2_sliding_window_layers_match_sdpa(device):
    omni, ref, lowp = models(causal_lm(qwen2_config()), device, reference="sdpa")
    input_ids = tokens(2, SEQ, device=device)
    attention_mask = padding([19, 24], SEQ, left=True, device=device)
    assert_same_logits_and_grads(omni, ref, lowp, attention_mask.bool(), dict(
        input_ids=input_ids, attention_mask=attention_mask, labels=labels_of(input_ids, attention_mask)))


def test_gemma3_text_sliding_window_and_softcap_match_eager(device):
    omni, ref, lowp = models(causal_lm(gemma3_text_config(attn_logit_softcapping=2.0)), device)
    input_ids = tokens(2, SEQ, device=device)
    attention_mask = padding([21, 24], SEQ, left=True, device=device)
    assert_same_logits_and_grads(omni, ref, lowp, attention_mask.bool(), dict(
        input_ids=input_ids, attention_mask=attention_mask, labels=labels_of(input_ids, attention_mask)))


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
def test_gemma3_image_blocks_from_token_type_ids_match_eager(padded, device):
    """Unpadded rows hand per-row image ids beside one row of document ids (a batch-2 crash)."""
    omni, ref, lowp = models(lambda attn: AutoModelForImageTextToText.from_config(
        gemma3_vlm_config(), attn_implementation=attn), device)
    input_ids = tokens(2, 20, device=device)
    input_ids[:, 3], input_ids[:, 4:8], input_ids[:, 8] = BOI, IMAGE, EOI  # an image in each row
    input_ids[1, 11], input_ids[1, 12:16], input_ids[1, 16] = BOI, IMAGE, EOI  # and a second one in row 1
    attention_mask = padding([18, 20] if padded else [20, 20], 20, left=True, device=device)
    pixel_values = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(2)).to(device)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask if padded else None, pixel_values=pixel_values,
                  token_type_ids=(input_ids == IMAGE).long(), labels=labels_of(input_ids, attention_mask))
    assert_same_logits_and_grads(omni, ref, lowp, attention_mask.bool(), inputs)
    without_blocks = omni(**{**inputs, "token_type_ids": None}).logits.float()
    with_blocks = omni(**inputs).logits.float()
    assert not torch.allclose(without_blocks[:, 4:8], with_blocks[:, 4:8], atol=1e-3)  # the blocks do matter


def test_vision_tower_attends_bidirectionally_like_eager(device):
    config = SiglipVisionConfig(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                image_size=16, patch_size=4)
    omni, ref, lowp = models(lambda attn: AutoModel.from_config(copy.deepcopy(config), attn_implementation=attn),
                             device)
    pixel_values = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3)).to(device)
    outputs = [None if m is None else m(pixel_values=pixel_values.to(m.dtype)).last_hidden_state.float()
               for m in (omni, ref, lowp)]
    assert_close_to_reference(*outputs, what="last_hidden_state")
    # bidirectional: the first patch depends on the last one
    changed = pixel_values.clone()
    changed[:, :, -4:, -4:] += 1
    first_patch = omni(pixel_values=changed.to(omni.dtype)).last_hidden_state[:, 0].float()
    assert not torch.allclose(first_patch, outputs[0][:, 0], atol=1e-3)


def additive_definition(q, k, v, mask, scale):
    """float64 attention with ``mask`` added to the scores, as eager adds a float mask; q [B, Hq, S, D], k and v
    [B, Hkv, S, D] (their heads repeated here), mask broadcastable to [B, Hq, S, S]."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.einsum("bhqd,bhkd->bhqk", q.double(), k) * scale + mask.double()
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


@pytest.mark.parametrize("values", ["images alone", "any additive values"])
def test_a_float_mask_a_model_makes_is_added_to_the_scores_as_eager_adds_it(values, device):
    """Pixtral's tower under Transformers 5.9 hands the attention function a float mask it makes itself: 0 within each
    image, the dtype's minimum elsewhere, ``[1, 1, S, S]`` expanded over the batch. omni adds it to the scores (the
    op's bias over every key), whatever its values: the output and the gradients of q, k and v are those of the
    float64 definition. Images of 40 and 30 patches: 70 keys cross a 64-key tile."""
    gen = torch.Generator().manual_seed(11)
    dtype = torch.bfloat16 if low_precision(device) else torch.float32
    batch, length, scale = 2, 70, 0.125
    image = torch.arange(length) >= 40
    mask = torch.where(image[:, None] == image[None], 0.0, torch.finfo(dtype).min)
    if values == "any additive values":
        mask = mask.clamp(min=-30.0) + torch.randn(length, length, generator=gen)
    mask = mask.to(device, dtype)[None, None].expand(batch, 1, length, length)
    q = torch.randn(batch, 4, length, 64, generator=gen).to(device, dtype).requires_grad_()
    k, v = (torch.randn(batch, 2, length, 64, generator=gen).to(device, dtype).requires_grad_() for _ in range(2))
    out, _ = omni_attention_forward(torch.nn.Module(), q, k, v, mask, scaling=scale)
    probe = torch.randn(out.shape, generator=gen).to(device)
    grads = torch.autograd.grad((out.float() * probe).sum(), (q, k, v))
    ref_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected = additive_definition(*ref_inputs, mask, scale).transpose(1, 2)
    ref_grads = torch.autograd.grad((expected * probe.double()).sum(), ref_inputs)
    bound = 2e-2 if low_precision(device) else 1e-5
    for got, want in zip((out, *grads), (expected, *ref_grads), strict=True):
        assert relative_error(got, want) < bound


def qwen_vision_config(model_type: str):
    """A tiny Qwen2-VL / Qwen2.5-VL vision tower: patches of 4 px, windows of 2 x 2 merged patches (Qwen2.5-VL,
    whose second layer attends whole images)."""
    common = dict(depth=2, num_heads=2, patch_size=4, spatial_merge_size=2, temporal_patch_size=2, hidden_act="silu")
    if model_type == "qwen2_5_vl":
        return Qwen2_5_VLVisionConfig(hidden_size=32, intermediate_size=64, out_hidden_size=32, window_size=16,
                                      fullatt_block_indexes=[1], **common)
    return Qwen2VLVisionConfig(embed_dim=32, hidden_size=32, mlp_ratio=2, **common)


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen2_vl"])
def test_packed_vision_tower_makes_one_call_per_layer_with_each_image_alone(model_type, device):
    """Qwen's towers pack their images; under omni each layer makes one call with the images' (or windows')
    bounds, and the tower matches eager's, which attends each image or window in a call of its own."""
    config = qwen_vision_config(model_type)
    tower = (Qwen2_5_VisionTransformerPretrainedModel if model_type == "qwen2_5_vl"
             else Qwen2VisionTransformerPretrainedModel)._from_config
    omni, ref, lowp = models(lambda attn: tower(copy.deepcopy(config), attn_implementation=attn), device)
    grid_thw = torch.tensor([[1, 8, 12], [1, 4, 4], [1, 6, 2]], device=device)  # 96 + 16 + 12 patches
    patches = torch.randn(124, 3 * 2 * 4 * 4, generator=torch.Generator().manual_seed(5)).to(device)
    calls = []

    def counting(module, query, *args, **kwargs):
        calls.append((query.shape[2], kwargs.get("cu_seq_lens_k") is not None))
        return omni_attention_forward(module, query, *args, **kwargs)

    for name in ("omni", PACKED):
        AttentionInterface.register(name, counting)
    try:
        out = omni(patches.to(omni.dtype), grid_thw=grid_thw).last_hidden_state.float()
    finally:
        omni_hf.register()
    outputs = [None if m is None else m(patches.to(m.dtype), grid_thw=grid_thw).last_hidden_state.float()
               for m in (ref, lowp)]
    assert_close_to_reference(out, *outputs, what="last_hidden_state")
    assert calls == [(124, True)] * 2, calls
    assert omni.config._attn_implementation == "omni"  # the packed name lives only inside the attention's forward


@pytest.mark.parametrize("is_causal", [False, True])
def test_a_packed_call_without_a_mask_attends_each_sequence_alone(is_causal, device):
    """What a packed tower's attention hands omni (no mask, ``cu_seq_lens_k``): the output of each sequence run
    alone, bidirectional or causal as the call says. Sequences that start and end inside 128-key tiles, one of a
    single token, at a tower's head dim (80, on the 96 kernels on a GPU); bf16 kernels on a GPU."""
    lengths, heads, dim = [70, 300, 1, 129, 64], 4, 80
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, heads, sum(lengths), dim, generator=g).to(device) for _ in range(3))
    lowp = torch.bfloat16 if low_precision(device) else torch.float32

    def alone(dtype):  # each sequence in a call of its own, as Transformers' split path runs them
        return torch.cat([torch.nn.functional.scaled_dot_product_attention(
            *(t[:, :, a:b].to(dtype) for t in (q, k, v)), is_causal=is_causal)
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())], dim=2).transpose(1, 2).float()

    out, _ = omni_attention_forward(torch.nn.Module(), *(t.to(lowp) for t in (q, k, v)), None, is_causal=is_causal,
                                    cu_seq_lens_q=bounds, cu_seq_lens_k=bounds)
    assert_close_to_reference(out.float(), alone(torch.float32), alone(lowp) if low_precision(device) else None,
                              what="packed output")


# ---------------------------------------------------------------------- packing and interleaved masks


def packed_batch(lengths, device):
    """Samples of ``lengths`` tokens, and the same samples packed into one row (inputs of both)."""
    samples = [tokens(1, n, seed=10 + i, device=device) for i, n in enumerate(lengths)]
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    cu_seq_lens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    doc_ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None].to(device)
    return samples, torch.cat(samples, dim=1), position_ids, cu_seq_lens, doc_ids


@pytest.mark.parametrize("signal", ["position_ids", "cu_seq_lens", "omni_doc_ids"])
@pytest.mark.parametrize("config", [llama_config, gemma3_text_config], ids=["llama", "gemma3-sliding"])
def test_packed_batch_equals_its_samples_run_one_by_one(signal, config, device):
    omni, ref, lowp = models(causal_lm(config()), device)
    lengths = [7, 9, 8]
    samples, packed, position_ids, cu_seq_lens, doc_ids = packed_batch(lengths, device)
    inputs = {"position_ids": position_ids, "use_cache": False}  # Transformers looks for packing without a cache
    if signal == "cu_seq_lens":  # with an attention mask Transformers does not look for packing in position_ids
        inputs |= {"attention_mask": torch.ones_like(packed), "cu_seq_lens_q": cu_seq_lens,
                   "cu_seq_lens_k": cu_seq_lens, "max_length_q": max(lengths), "max_length_k": max(lengths)}
    if signal == "omni_doc_ids":
        inputs |= {"omni_doc_ids": doc_ids}
    with torch.no_grad():
        got = omni(packed, **inputs).logits.float().split(lengths, dim=1)
        expected = [ref(sample).logits for sample in samples]
        baseline = [None if lowp is None else lowp(sample).logits.float() for sample in samples]
    for i in range(len(lengths)):
        assert_close_to_reference(got[i], expected[i], baseline[i], f"sample {i}")


def interleaved_ids(device):
    """Row 0: two packed samples with an image each; row 1: one sample with two images, then padding."""
    doc = torch.tensor([[0] * 10 + [1] * 14, [0] * 20 + [-1] * 4])
    grp = torch.full_like(doc, -1)
    grp[0, 3:7], grp[0, 12:18], grp[1, 5:9], grp[1, 14:16] = 0, 1, 0, 1
    position_ids = torch.tensor([list(range(10)) + list(range(14)), list(range(20)) + [0] * 4])
    return doc.to(device), grp.to(device), position_ids.to(device)


def interleaved_inputs(device):
    """The interleaved batch as omni's inputs (token ids), as a reference model's (the dense token-rule mask,
    written from its definition), and the rows to compare."""
    doc, grp, position_ids = interleaved_ids(device)
    input_ids = tokens(2, SEQ, device=device)
    common = dict(input_ids=input_ids, position_ids=position_ids, labels=input_ids.masked_fill(doc < 0, -100))
    allowed = token_rule_dense(doc.cpu(), grp.cpu(), SEQ).to(device)
    dense = torch.zeros(allowed.shape, device=device).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return common | {"omni_doc_ids": doc, "omni_group_ids": grp}, common | {"attention_mask": dense}, doc >= 0


def test_interleaved_group_ids_match_eager_with_the_dense_token_rule_mask(device):
    omni, ref, lowp = models(causal_lm(llama_config()), device)
    inputs, ref_inputs, rows = interleaved_inputs(device)
    assert_same_logits_and_grads(omni, ref, lowp, rows, inputs, ref_inputs)


def test_interleaved_group_ids_change_exactly_the_rows_whose_mask_changes(device):
    """After one layer, a row differs from plain causal attention exactly when its token-rule row does."""
    omni, _, _ = models(causal_lm(llama_config()), device)
    doc, grp, position_ids = interleaved_ids(device)
    input_ids = tokens(2, SEQ, device=device)
    with torch.no_grad():
        first_layer = [omni(input_ids, position_ids=position_ids, omni_doc_ids=doc, omni_group_ids=g,
                            output_hidden_states=True).hidden_states[1].float() for g in (grp, None)]
    change = (first_layer[0] - first_layer[1]).norm(dim=-1) / first_layer[1].norm(dim=-1)
    doc_cpu, grp_cpu = doc.cpu(), grp.cpu()
    text_only = torch.full_like(grp_cpu, -1)
    mask_changed = token_rule_dense(doc_cpu, grp_cpu, SEQ) != token_rule_dense(doc_cpu, text_only, SEQ)
    mask_changed = mask_changed.any(-1)[:, 0].to(device)
    assert mask_changed.sum() > 0 and (~mask_changed & (doc >= 0)).sum() > 0
    noise = 1e-2 if low_precision(device) else 1e-6
    assert (change[mask_changed] > 5e-2).all(), change
    assert (change[~mask_changed & (doc >= 0)] < noise).all(), change


def test_omni_block_mask_kwarg_wins_over_token_ids_and_the_attention_mask(device):
    omni, _, _ = models(causal_lm(llama_config()), device)
    doc, grp, position_ids = interleaved_ids(device)
    input_ids = tokens(2, SEQ, device=device)
    with torch.no_grad():
        from_ids = omni(input_ids, position_ids=position_ids, omni_doc_ids=doc, omni_group_ids=grp).logits
        from_block_mask = omni(input_ids, position_ids=position_ids, attention_mask=torch.ones_like(input_ids),
                               omni_block_mask=OmniBlockMask.from_token_ids(doc, grp),
                               omni_doc_ids=torch.zeros_like(doc)).logits
    assert torch.equal(from_ids, from_block_mask)



def per_layer_type_inputs(device):
    """The interleaved batch with a mask per layer type, Gemma 4's rules (image blocks in the sliding layers only,
    window 5 on their causal part): as omni's inputs (`OmniBlockMask`s) and as eager's (dense, written from the token
    rule's definition)."""
    doc, grp, position_ids = interleaved_ids(device)
    input_ids = tokens(2, SEQ, device=device)
    common = dict(input_ids=input_ids, position_ids=position_ids, labels=input_ids.masked_fill(doc < 0, -100))
    rules = {"full_attention": (torch.full_like(grp, -1), None), "sliding_attention": (grp, 5)}
    dense = {}
    for layer_type, (groups, window) in rules.items():
        allowed = token_rule_dense(doc.cpu(), groups.cpu(), SEQ, window).to(device)
        dense[layer_type] = torch.zeros(allowed.shape, device=device).masked_fill(~allowed,
                                                                                   torch.finfo(torch.float32).min)
    assert not torch.equal(*dense.values())
    omni_masks = {layer_type: OmniBlockMask.from_token_ids(doc, groups, window=window)
                  for layer_type, (groups, window) in rules.items()}
    return common | {"attention_mask": omni_masks}, common | {"attention_mask": dense}, doc >= 0


def test_a_block_mask_per_layer_type_matches_eager_with_those_masks_dense(device):
    omni, ref, lowp = models(causal_lm(gemma3_text_config()), device)
    inputs, ref_inputs, rows = per_layer_type_inputs(device)
    assert_same_logits_and_grads(omni, ref, lowp, rows, inputs, ref_inputs)


@pytest.mark.parametrize("mask, message", [
    (OmniBlockMask.causal(8), r"attention_mask: expected q_len=10, kv_len=10 .*got q_len=8, kv_len=8"),
    (OmniBlockMask.from_token_ids(_ids(3)), r"attention_mask: expected batch 1 or 2 \(that of input_ids\), got 3"),
], ids=["lengths", "batch"])
def test_a_block_mask_per_layer_type_of_other_sizes_is_refused_naming_the_attention_mask(mask, message):
    model = AutoModelForCausalLM.from_config(gemma3_text_config(), attn_implementation="omni").eval()
    with torch.no_grad(), pytest.raises(ValueError, match=message):
        model(tokens(2, 10), attention_mask={"full_attention": mask, "sliding_attention": mask})


# ---------------------------------------------------------------------- generation


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("config", [llama_config, gemma3_text_config], ids=["llama", "gemma3-sliding"])
def test_greedy_generate_on_left_padded_prompts_matches_sdpa(config, cache, device):
    omni, ref, _ = models(causal_lm(config()), device, reference="sdpa")
    prompts = tokens(3, 10, device=device)
    attention_mask = padding([10, 6, 3], 10, left=True, device=device)
    settings = dict(attention_mask=attention_mask, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                    cache_implementation=cache, disable_compile=True, pad_token_id=0)
    generated = omni.generate(prompts, **settings)
    if not low_precision(device):
        assert torch.equal(generated, ref.generate(prompts, **settings))
        return
    # bf16: each token must be the float32 reference's greedy choice up to bf16 error on near ties
    full_mask = torch.cat([attention_mask, torch.ones_like(generated[:, 10:])], dim=1)
    with torch.no_grad():
        logits = ref(generated, attention_mask=full_mask).logits[:, 9:-1].float()
    chosen = logits.gather(-1, generated[:, 10:, None]).squeeze(-1)
    assert (logits.amax(-1) - chosen <= 2e-2 * logits.abs().amax()).all()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("config", [llama_config, gemma3_text_config], ids=["llama", "gemma3-sliding"])
def test_chunked_prefill_gives_the_logits_of_one_forward(config, cache, device):
    cfg = config()
    omni, ref, lowp = models(causal_lm(cfg), device)
    input_ids = tokens(2, 20, device=device)
    attention_mask = padding([20, 15], 20, left=True, device=device)
    past = DynamicCache(config=cfg) if cache == "dynamic" else StaticCache(config=cfg, max_cache_len=32)
    with torch.no_grad():
        chunks = [omni(input_ids[:, start:stop], attention_mask=attention_mask[:, :stop], past_key_values=past,
                       use_cache=True).logits.float() for start, stop in ((0, 8), (8, 9), (9, 20))]
        expected = ref(input_ids, attention_mask=attention_mask).logits
        baseline = None if lowp is None else lowp(input_ids, attention_mask=attention_mask).logits.float()
    rows = attention_mask.bool()
    assert_close_to_reference(torch.cat(chunks, dim=1)[rows], expected[rows],
                              None if baseline is None else baseline[rows], "logits")


@pytest.mark.parametrize("device", DEVICES)
def test_all_ones_padding_is_dropped_where_a_host_sync_is_affordable(device):
    # Without autograd (a prompt's prefill under generate, an evaluation loop) and while decoding, an all-ones padding
    # mask counts as none, so the mask stays implicit (causal, no token rule); a training forward keeps it (no host
    # sync), and a padding mask with a zero is always kept.
    ones = torch.ones(B, SEQ, dtype=torch.long, device=device)
    padded = ones.clone()
    padded[0, :3] = 0
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(B, HEADS_Q, SEQ, HEAD_DIM, device=device, dtype=dtype)
    k, v = (torch.randn(B, HEADS_KV, SEQ, HEAD_DIM, device=device, dtype=dtype) for _ in range(2))
    want = naive_attention(q, k, v, torch.ones(SEQ, SEQ, dtype=torch.bool, device=device).tril(), 0.125)[0]
    with torch.no_grad():
        prefill = omni_mask(B, SEQ, SEQ, attention_mask=ones)
        decode = omni_mask(B, 1, SEQ, q_offset=SEQ - 1, attention_mask=ones)
        kept = omni_mask(B, SEQ, SEQ, attention_mask=padded)
    training = omni_mask(B, SEQ, SEQ, attention_mask=ones)
    assert prefill.padding_mask is None and decode.padding_mask is None
    assert kept.padding_mask is not None and training.padding_mask is not None
    for spec in (prefill, training):  # the same outputs either way
        with torch.no_grad():
            out, _ = omni_attention_forward(torch.nn.Module(), q, k, v, spec, scaling=0.125)
        assert relative_error(out.transpose(1, 2), want) < 2e-2
    assert block_mask_from_spec(prefill, device, None)[0].implicit
    assert not block_mask_from_spec(training, device, None)[0].implicit


# ---------------------------------------------------------------------- the mask spec against Transformers' own masks


B, HEADS_Q, HEADS_KV, HEAD_DIM = 2, 4, 2, 64


def mask_config(layer="full_attention"):
    return llama_config(num_hidden_layers=1, sliding_window=5, attention_chunk_size=6, layer_types=[layer])


def block_ids(device):
    ids = torch.full((B, SEQ), -1)
    ids[0, 4:9], ids[1, 2:5], ids[1, 10:16] = 0, 0, 1
    return {"block_sequence_ids": ids.to(device)}


def windowed_block_ids(length: int, long_image: bool):
    """Gemma 4's sliding-layer mask: (causal or same image) and inside the window (5), over ``length`` positions;
    images of 3 and 4 tokens, or one of 7 (longer than the window, which then cuts into it)."""
    def extra(device):
        ids = torch.full((B, length), -1)
        ids[0, 3:6], ids[1, 8:12] = 0, 0
        if long_image:
            ids[0, 12:19] = 1
        return {"or_mask_function": hf_masks.blockwise_overlay(ids.to(device)),
                "and_mask_function": hf_masks.sliding_window_overlay(5)}
    return extra


def restarting_positions(device):
    return {"position_ids": torch.tensor([list(range(7)) + list(range(9)) + list(range(8))] * B, device=device)}


def prefix_lm(batch_idx, head_idx, q_idx, kv_idx):
    return kv_idx < 6


@dataclasses.dataclass
class MaskCase:
    """A call of one of Transformers' mask creators: ``q_len`` new tokens after ``past`` cached ones."""

    creator: Callable
    layer: str = "full_attention"
    q_len: int = SEQ
    cache: str | None = None  # "dynamic" or "static" (24 slots)
    past: int = 0
    real: list[int] | None = None  # real tokens of each row of the 2D attention mask; None: no mask
    left: bool = True  # padding side
    encoder: int = 0  # cross-attention over this many encoder tokens (the 2D mask is theirs)
    extra: Callable = lambda device: {}  # noqa: E731  more creator arguments

    def arguments(self, config, device) -> dict:
        cache = None
        if self.cache is not None:
            cache = DynamicCache(config=config) if self.cache == "dynamic" else StaticCache(config, max_cache_len=24)
            if self.past:
                states = torch.randn(B, HEADS_KV, self.past, HEAD_DIM, device=device)
                cache.update(states, states, 0)
        mask_len = self.encoder or self.past + self.q_len
        attention_mask = None if self.real is None else padding(self.real, mask_len, self.left, device)
        encoder = {"encoder_hidden_states": torch.empty(B, self.encoder, 0, device=device)} if self.encoder else {}
        return dict(inputs_embeds=torch.empty(B, self.q_len, 0, device=device), attention_mask=attention_mask,
                    past_key_values=cache, **encoder, **self.extra(device))

    def query_rows(self, device) -> torch.Tensor:
        """The rows to compare: queries of real tokens (Transformers leaves padding rows arbitrary)."""
        if self.real is None or self.encoder:
            return torch.ones(B, self.q_len, dtype=torch.bool, device=device)
        return padding(self.real, self.past + self.q_len, self.left, device)[:, -self.q_len:].bool()


MASK_CASES = {
    "causal, left padding": MaskCase(hf_masks.create_causal_mask, real=[19, 24]),
    "causal, right padding": MaskCase(hf_masks.create_causal_mask, real=[21, 24], left=False),
    "causal, packed by position_ids": MaskCase(hf_masks.create_causal_mask, extra=restarting_positions),
    "sliding window, packed": MaskCase(hf_masks.create_sliding_window_causal_mask, "sliding_attention",
                                       extra=restarting_positions),
    "chunked, left padding": MaskCase(hf_masks.create_chunked_causal_mask, "chunked_attention", real=[20, 24]),
    "causal with image blocks": MaskCase(hf_masks.create_causal_mask, real=[22, 24], extra=block_ids),
    "sliding window or image blocks (images whole)": MaskCase(
        hf_masks.create_sliding_window_causal_mask, "sliding_attention", extra=block_ids),
    "sliding window over causal or image blocks, left padding": MaskCase(
        hf_masks.create_causal_mask, real=[20, 24], extra=windowed_block_ids(SEQ, long_image=False)),
    "sliding window over causal or image blocks, an image longer than it (tile by tile)": MaskCase(
        hf_masks.create_causal_mask, real=[20, 24], extra=windowed_block_ids(SEQ, long_image=True)),
    "sliding window over causal or image blocks, chunked prefill, dynamic cache": MaskCase(
        hf_masks.create_causal_mask, "sliding_attention", q_len=7, cache="dynamic", past=13, real=[16, 20],
        extra=windowed_block_ids(20, long_image=False)),
    "causal or a model's function (tile by tile)": MaskCase(
        hf_masks.create_causal_mask, real=[22, 24], extra=lambda device: {"or_mask_function": prefix_lm}),
    "bidirectional, right padding": MaskCase(hf_masks.create_bidirectional_mask, real=[18, 24], left=False),
    "bidirectional sliding window (tile by tile)": MaskCase(
        hf_masks.create_bidirectional_sliding_window_mask, "sliding_attention"),
    "cross-attention over a padded encoder": MaskCase(hf_masks.create_bidirectional_mask, q_len=7, encoder=11,
                                               real=[9, 11], left=False),
    "decode, dynamic cache": MaskCase(hf_masks.create_causal_mask, q_len=1, cache="dynamic", past=20, real=[15, 21]),
    "chunked prefill, dynamic cache": MaskCase(hf_masks.create_causal_mask, q_len=7, cache="dynamic", past=13,
                                               real=[16, 20]),
    "prefill, static cache": MaskCase(hf_masks.create_causal_mask, q_len=9, cache="static", real=[6, 9]),
    "decode, static cache": MaskCase(hf_masks.create_causal_mask, q_len=1, cache="static", past=15, real=[12, 16]),
    "chunked prefill, static cache, no attention mask": MaskCase(hf_masks.create_causal_mask, q_len=6,
                                                                 cache="static", past=10),
    "decode past the window, sliding cache": MaskCase(
        hf_masks.create_sliding_window_causal_mask, "sliding_attention", q_len=1, cache="dynamic", past=12,
        real=[9, 13]),
    "chunked prefill past the window, sliding cache": MaskCase(
        hf_masks.create_sliding_window_causal_mask, "sliding_attention", q_len=4, cache="dynamic", past=12),
    "decode, static sliding cache not yet full": MaskCase(
        hf_masks.create_sliding_window_causal_mask, "sliding_attention", q_len=1, cache="static", past=3,
        real=[3, 4]),
}


def spec_and_eager_mask(case: MaskCase, device) -> tuple[OmniMaskSpec, torch.Tensor]:
    """The omni spec of ``case`` and, from the same call under "eager", the bool mask of allowed pairs."""
    config = mask_config(case.layer)
    arguments = case.arguments(config, device)
    config._attn_implementation = "eager"
    eager = case.creator(config=config, **arguments)
    config._attn_implementation = "omni"
    spec = case.creator(config=config, **arguments)
    assert isinstance(spec, OmniMaskSpec)
    allowed = torch.ones(spec.shape, dtype=torch.bool, device=device) if eager is None else eager == 0
    assert allowed.shape[-2:] == spec.shape[-2:]
    return spec, allowed


@pytest.mark.parametrize("case", list(MASK_CASES))
def test_attention_with_the_omni_spec_matches_transformers_eager_mask(case, device):
    case = MASK_CASES[case]
    spec, allowed = spec_and_eager_mask(case, device)
    gen = torch.Generator().manual_seed(4)
    dtype = torch.bfloat16 if low_precision(device) else torch.float32
    q = torch.randn(B, HEADS_Q, spec.q_len, HEAD_DIM, generator=gen).to(device, dtype)
    k, v = (torch.randn(B, HEADS_KV, spec.kv_len, HEAD_DIM, generator=gen).to(device, dtype) for _ in range(2))
    out, weights = omni_attention_forward(torch.nn.Module(), q, k, v, spec, scaling=0.125)
    assert weights is None and out.shape == (B, spec.q_len, HEADS_Q, HEAD_DIM)
    expected, _ = naive_attention(q, k, v, allowed, 0.125)
    rows = case.query_rows(device)[:, None].expand(-1, HEADS_Q, -1)
    error = relative_error(out.transpose(1, 2)[rows], expected[rows])
    assert error < (2e-2 if low_precision(device) else 1e-5), error


def test_a_sliding_window_or_image_blocks_is_the_token_rule_with_the_window_not_built_tile_by_tile(monkeypatch):
    """``create_sliding_window_causal_mask`` with ``block_sequence_ids``: (causal and inside the window) or same
    image, each image whole although row 1's second (6 tokens) is longer than the window (5): Gemma 4's sliding
    layers under Transformers 5.9. That is the token rule with the window on its causal part: built from the ids,
    never evaluated tile by tile, it allows exactly the pairs eager's mask allows."""
    cpu = torch.device("cpu")
    spec, allowed = spec_and_eager_mask(MASK_CASES["sliding window or image blocks (images whole)"], cpu)
    monkeypatch.setattr(OmniBlockMask, "from_mask_fn", lambda *args, **kwargs: pytest.fail("built tile by tile"))
    block_mask, key_order = block_mask_from_spec(spec, cpu, None)
    assert key_order is None and torch.equal(block_mask.to_dense()[:, 0], allowed[:, 0])
    assert allowed[1, 0, 15, 10]  # 5 apart, past the window, in one image: allowed


def test_pooling_cross_attention_over_padded_patches_is_built_from_the_key_padding_not_tile_by_tile(monkeypatch):
    """Molmo2's image pooling: each pooled token (a batch row) is one query over its 2 x 2 patches, some of them
    padding. Its mask is the key padding, built without evaluating Transformers' function."""
    tokens, pool = 300, 4
    valid = torch.rand(tokens, pool, generator=torch.Generator().manual_seed(5)) < 0.7
    valid[:, 0] = True  # Molmo2 drops the pooled tokens with no patch
    arguments = dict(inputs_embeds=torch.empty(tokens, 1, 0), attention_mask=valid,
                     encoder_hidden_states=torch.empty(tokens, pool, 0))
    config = mask_config()
    config._attn_implementation = "omni"
    spec = hf_masks.create_bidirectional_mask(config=config, **arguments)
    monkeypatch.setattr(OmniBlockMask, "from_mask_fn", lambda *args, **kwargs: pytest.fail("built tile by tile"))
    block_mask, key_order = block_mask_from_spec(spec, torch.device("cpu"), None)
    assert key_order is None and torch.equal(block_mask.to_dense()[:, 0, 0], valid)
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(tokens, 2, 1, 16, generator=gen)
    k, v = (torch.randn(tokens, 2, pool, 16, generator=gen) for _ in range(2))
    out, _ = omni_attention_forward(torch.nn.Module(), q, k, v, spec, scaling=0.25)
    expected, _ = naive_attention(q, k, v, valid[:, None, None], 0.25)
    assert relative_error(out.transpose(1, 2), expected) < 1e-5


LAYER_SHAPES = [  # (query heads, KV heads, head dim, scaling, softcap) of layers sharing one forward's spec
    (HEADS_Q, HEADS_KV, HEAD_DIM, 0.125, None), (HEADS_Q, HEADS_KV, HEAD_DIM, 0.3, None),
    (HEADS_Q, HEADS_KV, HEAD_DIM, 0.125, 2.0), (8, 2, 32, None, None),
]


@pytest.mark.parametrize("case", ["causal, left padding", "decode, static cache", "sliding window, packed"])
def test_layers_sharing_a_spec_each_run_with_their_own_heads_scale_and_softcap(case, device):
    """A forward's layers share one spec, which keeps the mask and the call prepared for it: layers whose heads,
    head dim, scale or softcap differ, called in turn and again, each get their own exact result, and a layer whose
    keys do not match the spec is refused, naming the mask."""
    case = MASK_CASES[case]
    spec, allowed = spec_and_eager_mask(case, device)
    rows = case.query_rows(device)
    gen = torch.Generator().manual_seed(7)
    dtype = torch.bfloat16 if low_precision(device) else torch.float32
    layers = []
    for heads_q, heads_kv, dim, scaling, softcap in LAYER_SHAPES:
        q = torch.randn(B, heads_q, spec.q_len, dim, generator=gen).to(device, dtype)
        k, v = (torch.randn(B, heads_kv, spec.kv_len, dim, generator=gen).to(device, dtype) for _ in range(2))
        expected, _ = naive_attention(q, k, v, allowed, dim ** -0.5 if scaling is None else scaling, softcap)
        layers.append((q, k, v, scaling, softcap, expected))
    for q, k, v, scaling, softcap, expected in layers + layers:
        out, _ = omni_attention_forward(torch.nn.Module(), q, k, v, spec, scaling=scaling, softcap=softcap)
        selected = rows[:, None].expand(-1, q.shape[1], -1)
        error = relative_error(out.transpose(1, 2)[selected], expected[selected])
        assert error < (2e-2 if low_precision(device) else 1e-5), (q.shape, scaling, softcap, error)
    q, k, v = layers[0][:3]
    with pytest.raises(ValueError, match="block_mask: expected"):
        omni_attention_forward(torch.nn.Module(), q, k[:, :, 1:], v[:, :, 1:], spec, scaling=0.125)


# ---------------------------------------------------------------------- torch.compile


@pytest.mark.parametrize("inputs, backend, dynamic", [
    ("plain", "aot_eager", None), ("padding", "aot_eager", None), ("omni_ids", "aot_eager", None),
    ("padding", "aot_eager", True), pytest.param("padding", "inductor", None, marks=pytest.mark.slow),
])
def test_torch_compile_fullgraph_forward_backward_matches_eager(inputs, backend, dynamic, device):
    """Dynamo with fullgraph=True fails on any graph break. "plain" has no attention mask: under compile
    Transformers then composes packing detection into the mask function. aot_eager traces the backward through
    the op's fake kernels without generating code; inductor also checks the strides those kernels promise. With
    dynamic shapes the lengths are symbolic ints and the layers' scale a symbolic float, which the checks and the
    prepared call's key take."""
    omni, ref, lowp = models(causal_lm(llama_config()), device)
    input_ids = tokens(2, SEQ, device=device)
    attention_mask = padding([18, 24], SEQ, left=True, device=device)
    omni_inputs, ref_inputs, rows = {
        "plain": (dict(input_ids=input_ids, labels=input_ids), None, torch.ones_like(attention_mask).bool()),
        "padding": (dict(input_ids=input_ids, attention_mask=attention_mask,
                         labels=labels_of(input_ids, attention_mask)), None, attention_mask.bool()),
        "omni_ids": interleaved_inputs(device),
    }[inputs]
    torch._dynamo.reset()
    compiled = torch.compile(omni, fullgraph=True, backend=backend, dynamic=dynamic)
    assert_same_logits_and_grads(omni, ref, lowp, rows, omni_inputs, ref_inputs, omni_forward=compiled)
