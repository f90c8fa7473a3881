"""benchmarks/bench_vlm_training.py on the CPU: its search for the longest row, its packed rows, its flex masks
against omni's, Gemma 4's masks in every backend against Transformers' own, and tiny runs end to end (JSON, table,
omni giving sdpa's and eager's losses)."""

import collections
import copy
import json
import math
import random

import numpy as np
import pytest
import torch
import transformers
from transformers.models.gemma4 import modeling_gemma4

import omni_hf
from benchmarks import bench_vlm_training as bench
from omni_hf import OmniBlockMask
from omni_hf.integrations.transformers.attention import omni_attention_forward
from omni_hf.integrations.transformers.packed_towers import PACKED


@pytest.mark.parametrize("trial", range(4))
def test_longest_fitting_doubles_then_bisects_to_the_last_multiple_that_fits(trial):
    rng = random.Random(trial * 7919 + random.randrange(1000))
    start, resolution, cap = 256, 128, 128 * rng.randint(64, 512)
    boundary = rng.randint(start, cap + 5000)  # fits up to here
    found, probes = bench.longest_fitting(lambda n: n <= boundary, start, cap, resolution)
    assert found == min(cap, boundary // resolution * resolution)
    assert all(fitted == (n <= boundary) for n, fitted in probes)
    doubling, length = [], start  # the lengths probed first: doubling until one fails or the cap is reached
    while True:
        doubling.append(length)
        if length > boundary or length >= cap:
            break
        length = min(2 * length, cap)
    assert [n for n, _ in probes][:len(doubling)] == doubling
    assert len(probes) <= 2 * np.log2(cap / start) + 2, probes


def test_longest_fitting_is_none_when_the_start_does_not_fit():
    assert bench.longest_fitting(lambda n: False, 512, 4096, 128) == (None, [(512, False)])


@pytest.mark.parametrize("arch", ["qwen2.5-vl-3b", "gemma3-4b-hd128", "gemma4"])
def test_packed_row_fills_one_row_with_the_models_image_layout(arch):
    config = bench.ARCHS[arch](True)
    length = random.randrange(300, 700)
    batch, counts = bench.packed_row(config, length, random.randrange(1000), bench.TINY, torch.float32)
    ids = batch["input_ids"][0]
    assert batch["input_ids"].shape == (1, length) and (batch["omni_doc_ids"] >= 0).all()
    assert counts["samples"] == int(batch["omni_doc_ids"].max()) + 1 >= 2 and counts["images"] >= 1
    image = ids == config.image_token_id
    if arch.startswith("gemma3"):
        assert len(batch["pixel_values"]) == counts["images"] and image.sum() == 16 * counts["images"]
        assert torch.equal(batch["token_type_ids"][0], image.long())
        assert (batch["omni_group_ids"][0][image] >= 0).all(), "Gemma3 images are bidirectional blocks"
    elif arch == "gemma4":  # 8 x 8 patches of 4 px (3 x 16 values), pooled 2 x 2: 16 tokens
        assert batch["pixel_values"].shape == (counts["images"], 64, 48) and image.sum() == 16 * counts["images"]
        ys, xs = torch.arange(64) // 8, torch.arange(64) % 8
        assert torch.equal(batch["image_position_ids"], torch.stack([xs, ys], -1).expand(counts["images"], -1, -1))
        assert torch.equal(batch["mm_token_type_ids"][0], image.long())
        groups = batch["omni_group_ids"][0][image]
        assert torch.equal(groups.unique(), torch.arange(counts["images"])), "each image its own group"
    else:
        assert len(batch["image_grid_thw"]) == counts["images"]
        assert image.sum() == int((batch["image_grid_thw"].prod(-1) // 4).sum())
        assert batch["position_ids"].shape == (4, 1, length) and (batch["omni_group_ids"] == -1).all()


def test_flex_masks_are_omnis_token_rule_with_the_sliding_window():
    from torch.nn.attention.flex_attention import create_mask

    config = bench.ARCHS["gemma3-4b-hd128"](True)
    batch, _ = bench.packed_row(config, 384, random.randrange(1000), bench.TINY, torch.float32)
    doc, group = batch["omni_doc_ids"], batch["omni_group_ids"]
    mask_mods = bench.mask_mods(doc, group, {"full_attention": (True, None), "sliding_attention": (True, 40)})
    for layer_type, window in (("full_attention", None), ("sliding_attention", 40)):
        flex = create_mask(mask_mods[layer_type], 1, 1, 384, 384, device="cpu")
        assert torch.equal(flex, OmniBlockMask.from_token_ids(doc, group, window=window).to_dense())
    assert (group >= 0).any()


def gemma4_own_masks(config, batch) -> dict[str, torch.Tensor]:
    """Gemma 4's masks of a packed row as Transformers makes them for each sample alone (its positions from 0, so no
    packing to detect), placed on the diagonal: bool ``[1, 1, L, L]`` per layer type."""
    text = copy.deepcopy(config.get_text_config())
    text._attn_implementation = "eager"  # additive float masks, always made in full
    doc = batch["omni_doc_ids"][0]
    masks = {layer_type: torch.zeros(1, 1, len(doc), len(doc), dtype=torch.bool)
             for layer_type in set(text.layer_types)}
    for sample in doc.unique():
        start, stop = int((doc == sample).nonzero()[0]), int((doc == sample).nonzero()[-1]) + 1
        blocks = modeling_gemma4.get_block_sequence_ids_for_mask(batch["mm_token_type_ids"][:, start:stop], "cpu")
        own = modeling_gemma4.create_masks_for_vision_model(  # no padding mask, no cache (named so since 5.2x)
            text, torch.empty(1, stop - start, 1), None, None, torch.arange(stop - start)[None], blocks)
        for layer_type, mask in own.items():
            masks[layer_type][..., start:stop, start:stop] = mask == 0
    return masks


def test_gemma4_rows_give_every_backend_gemma4s_own_masks_per_layer_type():
    """omni's OmniBlockMasks, Flex's mask_mods, sdpa's and eager's dense masks: images bidirectional in the sliding
    layers only, the window cutting the causal part, samples apart."""
    from torch.nn.attention.flex_attention import create_mask

    config = bench.ARCHS["gemma4"](True)
    length = random.randrange(300, 500)
    batch, counts = bench.packed_row(config, length, random.randrange(1000), bench.TINY, torch.float32)
    doc, group = batch["omni_doc_ids"], batch["omni_group_ids"]
    own = gemma4_own_masks(config, batch)
    rules = bench.layer_rules(config)
    assert rules == {"full_attention": (False, None), "sliding_attention": (True, 32)}
    assert counts["images"] >= 2 and torch.bincount(doc[0]).max() > 32, "images, and samples longer than the window"
    assert not torch.equal(own["full_attention"], own["sliding_attention"])
    omni, sdpa, eager = (bench.prepared_masks(attn, doc, group, rules, torch.float32)()
                         for attn in ("omni", "sdpa", "eager"))
    mods = bench.mask_mods(doc, group, rules)
    for layer_type, mask in own.items():
        assert torch.equal(omni[layer_type].to_dense(), mask), layer_type
        assert torch.equal(sdpa[layer_type], mask), layer_type
        assert torch.equal(eager[layer_type] == 0, mask) and eager[layer_type].dtype == torch.float32, layer_type
        assert torch.equal(create_mask(mods[layer_type], 1, 1, length, length, device="cpu"), mask), layer_type


def test_tiny_run_writes_speed_longest_rows_and_equal_omni_and_sdpa_curves(tmp_path, capsys):
    """Qwen2.5-VL tiny (first arch: the curve) and Gemma3 tiny, omni and sdpa (flex has no backward on a CPU)."""
    result = bench.main(["--tiny", "--archs", "qwen2.5-vl-3b", "gemma3-4b-hd128", "--lengths", "128", "--attn", "omni",
                         "sdpa", "--steps", "1", "--warmup", "0", "--curve-steps", "2", "--find-max-length",
                         "--max-length-start", "128", "--max-length-cap", "128", "--out", str(tmp_path)])
    written = tmp_path / "vlm_training_qwen2.5-vl-3b-gemma3-4b-hd128_128_omni-sdpa_speed-maxlen-curve_tiny.json"
    assert json.loads(written.read_text()) == json.loads(json.dumps(result))
    speeds = [r for r in result["records"] if r["part"] == "speed"]
    assert [(r["arch"], r["attn"]) for r in speeds] == [(a, t) for a in ("qwen2.5-vl-3b", "gemma3-4b-hd128")
                                                         for t in ("omni", "sdpa")]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 and r["images"] >= 1 for r in speeds), speeds
    longest = [r for r in result["records"] if r["part"] == "max_length"]
    assert len(longest) == 4 and all(r["max_length"] == 128 and r["capped"] for r in longest)
    (curve,) = [r for r in result["records"] if r["part"] == "curve"]
    omni, sdpa = curve["losses"]["omni"], curve["losses"]["sdpa"]
    assert len(omni) == 2 and np.allclose(omni, sdpa, rtol=1e-5, atol=0), (omni, sdpa)  # float32: the same mask
    table = capsys.readouterr().out.split("qwen2.5-vl-3b 128: ", 1)[1]
    assert "omni/sdpa" in table and "longest row, omni: 128 (the cap)" in table and "curve, 2 steps" in table


def test_tiny_run_from_pixels_runs_the_vision_tower_on_omni_and_gives_sdpas_losses(tmp_path):
    """With --pixels every step runs the tower: omni's rows send its attention calls to omni (one per layer,
    Qwen2.5-VL's packed), the others' to sdpa, and the two give the same losses
    (float32, the same weights and rows)."""
    calls = collections.Counter()

    def counting(module, *args, **kwargs):
        calls[type(module).__name__] += 1
        return omni_attention_forward(module, *args, **kwargs)

    for name in ("omni", PACKED):
        transformers.AttentionInterface.register(name, counting)
    try:
        result = bench.main(["--tiny", "--pixels", "--archs", "qwen2.5-vl-3b", "gemma3-4b-hd128", "--lengths", "128",
                             "--attn", "omni", "sdpa", "no_attention", "--steps", "1", "--warmup", "0",
                             "--curve-steps", "2", "--out", str(tmp_path)])
    finally:
        omni_hf.register()
    assert (tmp_path / "vlm_training_qwen2.5-vl-3b-gemma3-4b-hd128_128_omni-sdpa-no_attention_speed-curve-pixels_tiny"
            ".json").is_file()
    speeds = [r for r in result["records"] if r["part"] == "speed"]
    assert all(r["status"] == "ok" and r["pixels"] for r in speeds), speeds
    assert {r["attn"]: r["vision_attn"] for r in speeds} == {"omni": "omni", "sdpa": "sdpa",
                                                             "no_attention": "no_attention"}
    assert calls["Qwen2_5_VLVisionAttention"] > 0 and calls["SiglipAttention"] > 0, calls
    (curve,) = [r for r in result["records"] if r["part"] == "curve"]
    omni, sdpa = curve["losses"]["omni"], curve["losses"]["sdpa"]
    assert curve["pixels"] and len(omni) == 2 and np.allclose(omni, sdpa, rtol=1e-5, atol=0), (omni, sdpa)


def test_tiny_gemma4_from_pixels_records_speed_and_omnis_losses_equal_sdpas_and_eagers(tmp_path, capsys):
    """Gemma 4 tiny from pixels on omni, sdpa and eager (flex has no backward on a CPU): the speed records and the
    curve. Every backend gets the same masks (Gemma 4's own), weights and rows, so in float32 the losses differ by
    rounding only: a few float32 ulps of the loss, summed over the step's ops (64 eps)."""
    calls = collections.Counter()

    def counting(module, *args, **kwargs):
        calls[type(module).__name__] += 1
        return omni_attention_forward(module, *args, **kwargs)

    transformers.AttentionInterface.register("omni", counting)
    try:
        result = bench.main(["--tiny", "--pixels", "--archs", "gemma4", "--lengths", "192", "--attn", "omni", "sdpa",
                             "eager", "--steps", "1", "--warmup", "1", "--curve-steps", "2", "--curve-attn", "omni",
                             "sdpa", "eager", "--out", str(tmp_path)])
    finally:
        omni_hf.register()
    written = tmp_path / "vlm_training_gemma4_192_omni-sdpa-eager_speed-curve-pixels_tiny.json"
    assert json.loads(written.read_text()) == json.loads(json.dumps(result))
    speeds = {r["attn"]: r for r in result["records"] if r["part"] == "speed"}
    assert list(speeds) == ["omni", "sdpa", "eager"]
    for attn, r in speeds.items():
        assert (r["arch"], r["length"], r["pixels"], r["status"]) == ("gemma4", 192, True, "ok"), r
        assert r["tokens_per_s"] > 0 and r["images"] >= 2 and r["samples"] >= 2, r
        assert len(r["losses"]) == 2 and all(math.isfinite(loss) for loss in r["losses"]), r
    assert {attn: r["vision_attn"] for attn, r in speeds.items()} == {"omni": "omni", "sdpa": "sdpa", "eager": "sdpa"}
    assert calls["Gemma4VisionAttention"] > 0 and calls["Gemma4TextAttention"] > 0, calls
    rtol = 64 * torch.finfo(torch.float32).eps
    for attn in ("sdpa", "eager"):
        assert np.allclose(speeds["omni"]["losses"], speeds[attn]["losses"], rtol=rtol, atol=0), attn
    (curve,) = [r for r in result["records"] if r["part"] == "curve"]
    assert curve["pixels"] and list(curve["losses"]) == ["omni", "sdpa", "eager"]
    omni = curve["losses"]["omni"]
    assert len(omni) == 2 and all(math.isfinite(loss) for loss in omni)
    assert curve["loss_start_end"] == [omni[0], omni[-1]]
    for attn in ("sdpa", "eager"):
        assert np.allclose(omni, curve["losses"][attn], rtol=rtol, atol=0), (omni, curve["losses"][attn])
        assert curve["gaps"][attn]["max_rel_diff"] <= rtol
    table = capsys.readouterr().out.split("gemma4 192: ", 1)[1]
    assert "omni/eager" in table and "loss max |omni - eager|" in table and "max |omni - eager|" in table


@pytest.mark.parametrize("arch", ["qwen2.5-vl-3b", "gemma3-4b-hd128", "gemma4"])
def test_a_step_from_pixels_trains_the_language_model_and_never_runs_the_frozen_towers_backward(arch):
    """Checkpointing makes input embeddings' outputs require grad; the benchmark's models undo that, so the frozen
    tower's features carry no graph while the language model's parameters all get gradients."""
    model = bench.build_model(arch, "sdpa", tiny=True, seed=random.randrange(1000), device=torch.device("cpu"),
                              dtype=torch.float32, vision_attn="sdpa")
    batch, _ = bench.packed_row(model.config, 128, random.randrange(1000), bench.TINY, torch.float32)
    tower_outputs = []
    hook = model.model.visual if hasattr(model.model, "visual") else model.model.vision_tower
    handle = hook.register_forward_hook(lambda module, args, output: tower_outputs.append(output))
    inputs = bench.step_inputs(model, batch, "sdpa", torch.device("cpu"), pixels=True)()
    model(**inputs).loss.backward()
    handle.remove()
    features = [t for out in tower_outputs for t in (out if isinstance(out, tuple) else out.values())
                if isinstance(t, torch.Tensor)]
    assert features and not any(t.requires_grad for t in features)
    language = [*model.model.language_model.parameters(), *model.lm_head.parameters()]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in language if p.requires_grad)


@pytest.mark.parametrize("arch", ["qwen2.5-vl-3b", "gemma3-4b-hd128", "gemma4"])
def test_chunked_lm_loss_equals_the_models_own_loss_and_gradients(arch):
    """Chunks that do not divide the row; the language model's inputs made once by the tower (Gemma 4's per-layer
    embeddings with them: inputs, so its table of them gets no gradient here)."""
    seed = random.randrange(1000)
    model = bench.build_model(arch, "sdpa", tiny=True, seed=seed, device=torch.device("cpu"), dtype=torch.float32)
    batch, _ = bench.packed_row(model.config, 300, seed, bench.TINY, torch.float32)
    inputs = bench.step_inputs(model, batch, "sdpa", torch.device("cpu"))()
    losses, grads = [], []
    for chunk in (0, random.randrange(40, 130)):
        model.zero_grad(set_to_none=True)
        loss = bench.chunked_lm_loss(model, inputs, chunk) if chunk else model(**inputs).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    inputs_only = {name for name, p in model.named_parameters() if p.requires_grad} - grads[0].keys()
    assert inputs_only == ({"model.language_model.embed_tokens_per_layer.weight"} if arch == "gemma4" else set())
    assert torch.allclose(losses[0], losses[1], rtol=1e-5, atol=0), losses
    assert grads[0].keys() == grads[1].keys()
    for own, chunked in zip(*(g.values() for g in grads)):
        assert torch.allclose(own, chunked, rtol=1e-4, atol=1e-6 * own.abs().max())


def test_table_gives_attention_time_over_the_no_attention_baseline_and_each_backends_loss_gap_to_omni():
    losses = {"omni": [2.5, 2.25], "sdpa": [2.5, 2.25 + 3e-3], "no_attention": [2.5, 7.0]}
    records = [{"part": "speed", "arch": "a", "length": 8, "attn": attn, "status": "ok", "step_ms": ms,
                "tokens_per_s": round(8e3 / ms), "peak_gib": 1.0, "losses": losses[attn]}
               for attn, ms in (("omni", 1250.0), ("sdpa", 2000.0), ("no_attention", 1000.0))]
    line = bench.table(records)
    assert "attention ms omni 250 (20%), sdpa 1000 (50%)" in line and "omni/no_attention" not in line
    assert "loss max |omni - sdpa| 3.00e-03" in line and "omni - no_attention" not in line
