"""Stock VLMs trained on packed rows: tiny random Gemma3, Qwen2-VL, Idefics3 (SmolVLM's architecture),
LLaVA and PaliGemma, samples straight from their processors, packed by `OmniCollator.from_config`.

A packed batch must give the loss and every parameter gradient of the same samples run one by one through the
model's own eager path (float32, 1e-5 relative error): that pins the collator's image blocks, labels, per-token
inputs, vision inputs in packed order and Qwen2-VL's 3-D positions against what the model computes for a sample
alone (its masks from ``token_type_ids``, its ``get_rope_index``). Then a few `trl.SFTTrainer` steps of the example
(examples/sft_vlm.py), with and without a PEFT LoRA adapter, must lower the loss.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers

from omni_hf import OmniCollator
from tests.helpers.brute_force import relative_error
from tests.helpers.model_checks import joined_key_bias
from tests.helpers.vlm_samples import sft_vlm, with_images

ARCHS = ["gemma3", "qwen2_vl", "idefics3", "llava", "paligemma"]


# ---------------------------------------------------------------------- models


def pair(config: transformers.PretrainedConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model with attn_implementation "omni" and "eager", one set of random weights, float32, train mode
    (no dropout in these configs). Weights the models initialise to zeros or a constant (Gemma3's image projection,
    norms, biases) are drawn at random too, so that every parameter gets a gradient of its own."""
    torch.manual_seed(0)
    eager = transformers.AutoModelForImageTextToText.from_config(copy.deepcopy(config), attn_implementation="eager")
    with torch.no_grad():
        for parameter in eager.parameters():
            if parameter.numel() == 1 or parameter.std() == 0:
                parameter.add_(0.1 * torch.randn_like(parameter))
    omni = transformers.AutoModelForImageTextToText.from_config(copy.deepcopy(config), attn_implementation="omni")
    omni.load_state_dict(eager.state_dict())
    return omni, eager


def alone_inputs(config, sample: dict) -> tuple[dict, int]:
    """One sample as the model takes it from its processor, with LM labels (the processor's, else the tokens; none
    on image tokens), and the number of labels its shift-by-one loss counts."""
    inputs = {k: v for k, v in sample.items() if k != "attention_mask"}
    labels = inputs.get("labels", inputs["input_ids"]).masked_fill(inputs["input_ids"] == config.image_token_id, -100)
    return inputs | {"labels": labels}, int((labels[:, 1:] != -100).sum())


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_batch_gives_the_loss_and_gradients_of_its_samples_run_one_by_one(arch):
    """Five samples (with 0-2 images each) packed into rows of 160 tokens, one row padded; omni on the packed batch
    against eager on each sample alone, whose losses are combined as the packed batch's mean over all labels."""
    config, samples = with_images(arch, 5, seed=ARCHS.index(arch))
    omni, eager = pair(config)
    length = max(s["input_ids"].shape[1] for s in samples)
    batch = OmniCollator.from_config(config, mode="pack", max_length=max(160, length))(samples)
    assert (batch["omni_doc_ids"].amax(1) >= 1).any(), "some row packs several samples"
    assert "attention_mask" in batch, "some row is padded"

    omni.zero_grad()
    packed_loss = omni(**batch).loss
    packed_loss.backward()
    packed_grads = gradients(omni)

    eager.zero_grad()
    runs = [alone_inputs(config, sample) for sample in samples]
    total = sum(count for _, count in runs)
    alone_loss = sum(eager(**inputs).loss * count / total for inputs, count in runs if count)  # 1-token samples: none
    alone_loss.backward()
    alone_grads = gradients(eager)

    assert relative_error(packed_loss.detach(), alone_loss.detach()) <= 1e-5
    assert packed_grads.keys() == alone_grads.keys() and packed_grads
    tower = [grad for name, grad in alone_grads.items() if "vision" in name or "visual" in name]
    assert tower and any(grad.abs().sum() > 0 for grad in tower), "the images reach the loss"
    for name in alone_grads:
        error = relative_error(*(joined_key_bias(grads, name) for grads in (packed_grads, alone_grads)))
        assert error <= 1e-5, f"{name}: relative error {error:.2e}"


def test_gemma3_image_blocks_matter_in_the_packed_batch():
    """The same packed batch with each image made causal (image_attention="causal") gives other logits, far beyond
    the tolerance above: the equality is not blind to the image blocks."""
    config, samples = with_images("gemma3", 5, seed=0)
    omni, _ = pair(config)
    with torch.no_grad():
        logits = [omni(**OmniCollator.from_config(config, mode="pack", max_length=160, image_attention=attention)(
            samples)).logits for attention in ("bidirectional", "causal")]
    assert relative_error(logits[1], logits[0]) > 1e-3


# ---------------------------------------------------------------------- SFTTrainer


def sft_run(tmp_path, arch: str, lora: bool) -> tuple[list[float], dict, dict]:
    """Six SFTTrainer steps of the example on the synthetic colours: the losses, and the weights before and after."""
    pytest.importorskip("trl")
    if lora:
        pytest.importorskip("peft")
    model, processor = sft_vlm.load(arch, None, seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    losses = sft_vlm.train(model, processor, sft_vlm.synthetic_dataset(48, seed=1), str(tmp_path), steps=6,
                           batch_samples=8, max_length=256, lr=1e-2 if lora else 3e-3, lora=lora, seed=0)
    after = {name: p.detach().clone() for name, p in model.named_parameters()}
    return losses, before, after


@pytest.mark.parametrize("arch", ["gemma3", "idefics3"])
def test_sft_trainer_steps_on_packed_conversations_lower_the_loss(tmp_path, arch):
    losses, before, after = sft_run(tmp_path, arch, lora=False)
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.3, losses
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_sft_trainer_with_a_lora_adapter_trains_only_the_adapter_and_lowers_the_loss(tmp_path):
    losses, before, after = sft_run(tmp_path, "gemma3", lora=True)
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 0.1, losses
    adapters = [name for name in after if "lora_" in name]
    assert adapters and any(after[name].abs().sum() > 0 for name in adapters if "lora_B" in name)
    base = {name.replace("base_layer.", ""): value for name, value in after.items() if "lora_" not in name}
    assert base.keys() == before.keys()
    assert all(torch.equal(before[name], base[name]) for name in before), "the base model stays frozen"
