"""Smoke tests of the small-VLM training script (`training/`) on the CPU: the tiny preset trains, its
checkpoint reloads to the same held-out loss, --resume goes on where it stopped, and every attention
backend sees the collator's interleaved mask."""

import json

import numpy as np
import pytest
import torch

for extra in ("accelerate", "datasets", "safetensors", "tqdm", "matplotlib"):  # training/'s extra (`train`)
    pytest.importorskip(extra, reason=f"training/ needs {extra}: python3 -m pip install -e '.[train]'")

from omni_hf import OmniBlockMask, OmniCollator  # noqa: E402
from omni_hf.integrations.transformers.other_backends import attention_kwargs, dense_mask  # noqa: E402
from training.data import COLOURS, RGB, SampleEncoder, SceneConfig, make_tokenizer, render  # noqa: E402
from training.evaluate import held_out_evaluator, summarise  # noqa: E402
from training.model import VLM, VisionConfig, build_lm  # noqa: E402
from training.train_vlm import PRESETS, main, make_splits  # noqa: E402

TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def one_thread():
    """The tiny model's matrices are too small for threads to pay; one thread is also immune to a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_thread):
    """The tiny preset trained with omni attention, checkpointed half way and at the end."""
    out = tmp_path_factory.mktemp("tiny")
    metrics = main(["--preset", "tiny", "--attn", "omni", "--output-dir", str(out),
                    "--save-every", str(TINY.steps // 2)])
    return out, metrics


def test_tiny_run_loss_decreases(tiny_run):
    out, metrics = tiny_run
    losses = [record["loss"] for record in metrics["train"]]
    assert len(losses) == TINY.steps
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert metrics["eval"][-1]["loss"] < metrics["eval"][0]["loss"]
    assert json.loads((out / "metrics.json").read_text())["summary"] == metrics["summary"]
    assert (out / "metrics.png").stat().st_size > 0


def test_checkpoint_reloads_to_the_same_eval_loss(tiny_run):
    out, metrics = tiny_run
    model = VLM.from_pretrained(out / f"checkpoint-{TINY.steps}" / "model", attn="omni").eval()
    _, held_out = make_splits(TINY, seed=0)
    evaluator = held_out_evaluator(held_out, make_tokenizer(), TINY.scene, "omni", "interleaved")
    reloaded = summarise(evaluator(model, torch.device("cpu")))
    assert reloaded["loss"] == pytest.approx(metrics["eval"][-1]["loss"], rel=1e-5)
    assert reloaded["accuracy"] == metrics["eval"][-1]["accuracy"]


def test_resume_from_the_middle_ends_where_the_whole_run_ended(tiny_run, tmp_path):
    out, metrics = tiny_run
    resumed = main(["--preset", "tiny", "--attn", "omni", "--output-dir", str(tmp_path),
                    "--resume", str(out / f"checkpoint-{TINY.steps // 2}")])
    assert [r["step"] for r in resumed["train"]] == [r["step"] for r in metrics["train"]]
    assert resumed["eval"][-1]["loss"] == pytest.approx(metrics["eval"][-1]["loss"], rel=1e-4)


@pytest.fixture(scope="module")
def packed_batch():
    """Eight encoded tiny samples packed into rows of 128 tokens (several samples and images per row)."""
    tokenizer = make_tokenizer()
    train, _ = make_splits(TINY, seed=0)
    encoded = train.select(range(8)).with_transform(SampleEncoder(tokenizer, TINY.scene))
    collator = OmniCollator(tokenizer.pad_id, mode="pack", max_length=128, pad_to_multiple_of=128)
    return collator([encoded[i] for i in range(8)])


def test_dense_mask_is_the_omni_token_rule(packed_batch):
    doc, group = packed_batch["omni_doc_ids"], packed_batch["omni_group_ids"]
    expected = OmniBlockMask.from_token_ids(doc, group).to_dense()[:, 0]  # [B, L, L]
    real = doc >= 0  # padding queries see themselves in the dense mask (no empty rows)
    assert torch.equal(dense_mask(doc, group)[:, 0][real], expected[real])


@pytest.mark.parametrize("mask", ["interleaved", "causal"])
def test_every_backend_gives_the_logits_of_omni(packed_batch, one_thread, mask):
    torch.manual_seed(0)
    tokenizer = make_tokenizer()
    model = VLM(build_lm(TINY.lm, len(tokenizer), 128, "omni"),
                VisionConfig(TINY.scene.image_size, TINY.scene.cell, tokenizer.image_id)).eval()
    logits = {}
    for attn in ("omni", "sdpa", "eager"):
        model.lm.set_attn_implementation(attn)
        with torch.no_grad():
            logits[attn] = model(packed_batch["input_ids"], packed_batch["pixel_values"],
                                 **attention_kwargs(packed_batch, attn, mask))
    real = packed_batch["omni_doc_ids"] >= 0
    for attn in ("sdpa", "eager"):
        torch.testing.assert_close(logits[attn][real], logits["omni"][real], rtol=1e-4, atol=1e-4)


def test_image_patch_shows_its_cell():
    config = SceneConfig(grid=3, cell=8)
    cells = np.zeros(9, dtype=np.int64)
    cells[5] = 1 + 0 * len(COLOURS) + 0  # a red circle in row 1, column 2
    image = render(cells, config, np.random.default_rng(0)).astype(int)
    patches = image.reshape(3, 3, 8, 3, 8).transpose(1, 3, 0, 2, 4).reshape(9, 3, -1)  # [cell, rgb, pixels]
    near_red = (np.abs(patches - RGB[0][None, :, None]) <= 25).all(axis=1).sum(axis=1)
    assert near_red[5] > 10 and (np.delete(near_red, 5) == 0).all()
