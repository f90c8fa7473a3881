"""benchmarks/bench_model_step.py on the CPU: its arguments, cases and table, and a tiny run end to end in a process
of its own as a user starts it (JSON records of every arch x backend, the table, omni's first loss against eager's)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_model_step as bench

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_defaults_and_tiny_sizes():
    real, tiny = bench.parse_args(["--out", "x"]), bench.parse_args(["--tiny", "--out", "x"])
    assert (real.lengths, real.encoder_lengths, real.decoder_length, real.batch, real.steps, real.warmup) == (
        (8192,), (2048,), 512, 4, 10, 3)
    assert (tiny.lengths, tiny.encoder_lengths, tiny.decoder_length, tiny.batch, tiny.steps, tiny.warmup) == (
        (256,), (256,), 64, 2, 2, 1)
    assert real.archs == ("gpt-oss-shaped", "t5-base-sized") and real.attn is None
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--attn", "flash_attention_2"])


def test_out_defaults_to_the_out_variable_else_the_results_folder(monkeypatch):
    monkeypatch.setenv("OUT", "/some/where")
    assert bench.parse_args([]).out == Path("/some/where")
    monkeypatch.delenv("OUT")
    assert bench.parse_args([]).out == REPO_ROOT / "benchmarks" / "results" / "model_step"


def test_cases_run_each_archs_own_backends_unless_named():
    args = bench.parse_args(["--length", "4096", "8192", "--encoder-length", "1024", "--batch", "8"])
    got = [(c.arch, c.length, c.attn, c.decoder_length, c.batch) for c in bench.cases(args)]
    assert got == ([("gpt-oss-shaped", n, attn, None, 1) for n in (4096, 8192)
                    for attn in ("omni", "eager", "flex_attention", "sdpa")]
                   + [("t5-base-sized", 1024, attn, 512, 8) for attn in ("omni", "sdpa", "eager")])
    named = bench.parse_args(["--archs", "t5-base-sized", "--attn", "omni", "flex_attention"])
    assert [c.attn for c in bench.cases(named)] == ["omni", "flex_attention"]
    assert bench.cases(named)[0].tokens == 4 * (2048 + 512)


def test_configs_have_the_stated_sizes():
    gpt = bench.gpt_oss_shaped(tiny=False)
    assert (gpt.hidden_size, gpt.num_hidden_layers, gpt.num_attention_heads, gpt.num_key_value_heads, gpt.head_dim,
            gpt.num_local_experts, gpt.num_experts_per_tok, gpt.intermediate_size, gpt.sliding_window) == (
        2880, 4, 64, 8, 64, 8, 2, 2880, 128)
    assert gpt.layer_types == ["sliding_attention", "full_attention"] * 2
    t5 = bench.t5_base_sized(tiny=False)
    assert (t5.d_model, t5.num_layers, t5.num_decoder_layers, t5.num_heads, t5.d_kv, t5.d_ff, t5.dropout_rate) == (
        768, 12, 12, 12, 64, 3072, 0.0)


def test_result_names_keep_runs_of_other_archs_lengths_and_backends_apart():
    assert bench.result_name(bench.parse_args([])) == (
        "model_step_gpt-oss-shaped-t5-base-sized_8192-2048-512x4_default.json")
    args = bench.parse_args(["--archs", "gpt-oss-shaped", "--length", "16384", "--attn", "omni", "eager", "--tiny"])
    assert bench.result_name(args) == "model_step_gpt-oss-shaped_16384_omni-eager_tiny.json"


def record(attn, tokens_per_s, loss=2.0, status="ok", **extra):
    base = {"arch": "gpt-oss-shaped", "length": 8192, "attn": attn, "status": status}
    if status != "ok":
        return base | extra
    return base | {"ms": round(8192e3 / tokens_per_s, 1), "tokens_per_s": tokens_per_s, "loss": loss,
                   "losses": [loss, loss - 1], "peak_gib": 40.0} | extra


def test_table_gives_omnis_speedup_and_each_loss_against_eagers():
    records = [record("omni", 20000, 2.0004), record("eager", 5000, 2.0), record("flex_attention", 10000, 2.003),
               record("sdpa", 0, status="skipped", reason="ValueError: no sinks")]
    bench.loss_gaps(records)
    assert records[0]["loss_minus_eager"] == pytest.approx(4e-4) and "loss_minus_eager" not in records[1]
    text = bench.table(records)
    eager, flex, sdpa = (next(line for line in text.splitlines()[2:] if f" {attn} " in line)
                         for attn in ("eager", "flex_attention", "sdpa"))
    assert eager.endswith("4.00x") and flex.endswith("2.00x") and "+3.0e-03" in flex
    assert "skipped: ValueError: no sinks" in sdpa
    assert "omni's first loss - eager's = +4.00e-04 (within 1e-03); after 2 steps +4.00e-04" in text
    records[0] |= {"loss": 2.01}
    bench.loss_gaps(records)
    assert "(EXCEEDS 1e-03)" in bench.table(records)


def test_a_refusal_at_build_is_a_skipped_record_and_an_error_in_a_step_a_failure(monkeypatch):
    args = bench.parse_args(["--tiny", "--archs", "gpt-oss-shaped", "--attn", "omni", "--steps", "1", "--warmup", "0"])
    (case,) = bench.cases(args)
    context = {"device": torch.device("cpu"), "dtype": torch.float32}

    def refuse(*args, **kwargs):
        raise ValueError("this model takes no such attention\nsecond line")

    monkeypatch.setattr(bench, "build_model", refuse)
    assert bench.run_case(case, args, context) | {"checkpointing": None} == {
        "arch": "gpt-oss-shaped", "length": 256, "attn": "omni", "checkpointing": None, "status": "skipped",
        "reason": "ValueError: this model takes no such attention"}

    def broken_step(*args, **kwargs):
        raise RuntimeError("kernel failed")

    monkeypatch.undo()
    monkeypatch.setattr(bench, "train_step", broken_step)
    got = bench.run_case(case, args, context)
    assert (got["status"], got["error"]) == ("error", "RuntimeError: kernel failed")


@pytest.mark.slow
def test_tiny_run_records_every_arch_and_backend_and_omnis_loss_is_eagers(tmp_path):
    """The command a user runs, in a process of its own: float32 on the CPU, omni on its reference. flex_attention
    refuses gpt-oss's sinks on a CPU (an error record), Transformers' sdpa refuses gpt-oss (skipped); T5 on omni runs
    with its position bias, its loss eager's."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_model_step", "--tiny", "--steps", "1", "--warmup",
                           "0", "--out", str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = tmp_path.glob("model_step_*.json")
    assert written.name == "model_step_gpt-oss-shaped-t5-base-sized_256-256-64x2_default_tiny.json"
    result = json.loads(written.read_text())
    assert {"device", "torch", "transformers", "command", "date"} <= set(result["meta"])
    assert result["meta"]["command"].startswith("python -m benchmarks.bench_model_step --tiny")
    cells = {(r["arch"], r["attn"]): r for r in result["records"]}
    assert list(cells) == [("gpt-oss-shaped", attn) for attn in ("omni", "eager", "flex_attention", "sdpa")] + [
        ("t5-base-sized", attn) for attn in ("omni", "sdpa", "eager")]
    for r in result["records"]:
        assert r["status"] in ("ok", "skipped", "error"), r
        if r["status"] == "ok":
            assert r["tokens_per_s"] > 0 and r["ms"] > 0 and r["loss"] > 0 and r["steps"] == 1, r
    for ran in (("gpt-oss-shaped", "omni"), ("gpt-oss-shaped", "eager"), ("t5-base-sized", "omni"),
                ("t5-base-sized", "sdpa"), ("t5-base-sized", "eager")):
        assert cells[ran]["status"] == "ok", cells[ran]
    t5 = cells["t5-base-sized", "eager"]
    assert (t5["length"], t5["decoder_length"], t5["batch"], t5["tokens"]) == (256, 64, 2, 2 * (256 + 64))
    assert cells["gpt-oss-shaped", "sdpa"]["status"] == "skipped"
    assert "GptOssForCausalLM does not support" in cells["gpt-oss-shaped", "sdpa"]["reason"]
    for arch in ("gpt-oss-shaped", "t5-base-sized"):
        omni, eager = cells[arch, "omni"], cells[arch, "eager"]
        assert abs(omni["loss"] - eager["loss"]) <= 1e-3 and omni["loss_minus_eager"] == omni["loss"] - eager["loss"]
    table = done.stdout.split("[7/7]", 1)[1]
    assert "tokens/s" in table and "peak GiB" in table and "omni x" in table
    assert "gpt-oss-shaped 256: omni's first loss - eager's = " in table and "(within 1e-03)" in table
    assert f"wrote {written}" in done.stdout.splitlines()[-1]
