"""The context-parallel cost model against brute-force pair counts and against figures derived by hand from its
definitions (FLOPs of a Llama layer, a ring's rounds, each schedule's bytes across nodes, Ulysses' all-to-all bytes);
its fit, which recovers the constants that made a set of runs; its CLI on a tiny setting."""

import dataclasses
import json
import math
import random

import numpy as np
import pytest

from benchmarks import context_parallel_model as model
from tests.helpers.brute_force import packed_vlm_ids, random_token_ids, token_rule_dense

FREE_LINKS = dict(nvlink_gb_s=math.inf, network_gb_s=math.inf, latency_s=0.0)


def fresh_seed() -> int:
    return random.randrange(2**31)


def dense_rule(doc, grp) -> np.ndarray:
    """bool [B, S, S] of the token rule, from the dense definition."""
    return token_rule_dense(doc, grp, doc.shape[-1])[:, 0].numpy()


def random_bounds(length: int, shards: int, rng: np.random.Generator) -> list[int]:
    """Cut points of ``shards`` contiguous shards (some may be empty)."""
    return [0, *sorted(rng.integers(0, length + 1, shards - 1).tolist()), length]


def llama_pair_s(hardware: model.Hardware, pairs: float) -> tuple[float, float]:
    """Llama-3.2-1B's attention time of ``pairs`` in one layer, forward and backward: 4 D Hq FLOPs a pair forward
    (QK^T and PV, 32 heads of 64), 2.5x that backward, at the forward and the forward+backward rates."""
    forward_flops = 4 * 64 * 32 * pairs
    forward = forward_flops / (hardware.attention_forward_tflops * 1e12)
    return forward, 3.5 * forward_flops / (hardware.attention_training_tflops * 1e12) - forward


def test_llama_token_flops_are_twice_its_parameters():
    # Llama-3.2-1B has 1.236e9 parameters (embedding tied to the head); norms are 0.07M of them
    assert model.LLAMA_3_2_1B.token_flops / 2 == pytest.approx(1.2358e9, rel=1e-3)


def test_pairs_per_shard_pair_match_the_dense_rule():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for trial in range(6):
        doc, grp = random_token_ids(2, 320, seed + trial)
        bounds = random_bounds(320, int(rng.integers(1, 7)), rng)
        dense = dense_rule(doc, grp).sum(0)
        expected = [[dense[a:b, c:d].sum() for c, d in zip(bounds, bounds[1:])] for a, b in zip(bounds, bounds[1:])]
        np.testing.assert_array_equal(model.shard_pairs(doc.numpy(), grp.numpy(), bounds), expected,
                                      err_msg=f"seed {seed + trial}, bounds {bounds}")


@pytest.mark.parametrize("scheme", model.SCHEMES)
def test_attention_work_per_rank_matches_the_dense_rule(scheme):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    hardware = model.Hardware(ranks_per_node=2)
    for trial in range(4):  # given shards on any ids, then shards balanced (cut between images) on packed rows
        doc, grp = (random_token_ids(2, 512, seed + trial) if trial == 0
                    else packed_vlm_ids(trial % 2 + 1, 512, seed + trial, image_range=(16, 48)))
        dense = dense_rule(doc, grp).sum(0)
        bounds = random_bounds(512, 4, rng) if trial < 2 else 4
        prediction = model.predict_step(model.LLAMA_3_2_1B, doc.numpy(), grp.numpy(), bounds, scheme, hardware)
        cuts = prediction.bounds
        rows = [dense[a:b].sum() for a, b in zip(cuts, cuts[1:])]
        if scheme == "ulysses":  # each GPU of a node: half the heads over the node's shard
            rows = [sum(rows[r - r % 2:r - r % 2 + 2]) / 2 for r in range(4)]
        np.testing.assert_allclose(prediction.attention_pairs, rows, err_msg=f"seed {seed + trial}, cuts {cuts}")


def test_all_gather_without_communication_divides_one_rank_by_w():
    # documents of 512 tokens, each one bidirectional group: every shard of whole documents does the same work
    world, documents, size = 4, 8, 512
    doc = np.repeat(np.arange(documents), size)
    hardware = model.Hardware(**FREE_LINKS)
    one = model.predict_step(model.LLAMA_3_2_1B, doc, doc, 1, "all_gather", hardware)
    forward, backward = llama_pair_s(hardware, documents * size**2)
    tokens_s = documents * size * 3 * 2 * 1.2358e9 / (hardware.gemm_tflops * 1e12)
    assert one.step_s == pytest.approx(tokens_s + 16 * (forward + backward), rel=1e-3)
    split = model.predict_step(model.LLAMA_3_2_1B, doc, doc, world, "all_gather", hardware)
    assert split.bounds == (0, 1024, 2048, 3072, 4096)
    assert split.step_s == pytest.approx(one.step_s / world, rel=1e-12)
    assert split.imbalance == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("nvlink_gb_s", [1.0, 1e4])  # transfers longer than the calls, then shorter
def test_ring_step_is_the_longer_of_compute_and_transfer(nvlink_gb_s):
    """One bidirectional image over the whole row: every (query shard, key shard) pair is full, (S / W)^2 pairs, so
    each shard goes round the whole ring, one hop a round (3 rounds at W = 4). Forward: the own shard's call, then
    each round's call once its shard is in (rounds back to back): f + 3 max(f, d). Backward: the last round's call,
    then each round's return overlapped with the call before: b + 3 max(b, d). Free matmuls and latency."""
    world, shard = 4, 1024
    ids = np.zeros(world * shard, np.int64)
    hardware = model.Hardware(gemm_tflops=math.inf, nvlink_gb_s=nvlink_gb_s, latency_s=0.0)
    ring = model.predict_step(model.LLAMA_3_2_1B, ids, ids, list(range(0, world * shard + 1, shard)), "ring",
                              hardware)
    forward, backward = llama_pair_s(hardware, shard**2)
    transfer = shard * 2 * 8 * 64 * 2 / (nvlink_gb_s * 1e9)  # K and V of 8 heads of 64, bf16
    layer = forward + 3 * max(forward, transfer) + backward + 3 * max(backward, transfer)
    assert ring.ring_steps == world - 1
    np.testing.assert_allclose(ring.rank_s, 16 * layer, rtol=1e-12)


def test_ring_of_whole_shards_waits_for_a_slow_neighbours_shard():
    # rank 0's first block takes 5: rank 1 gets shard 0 late and waits; rank 2 is never delayed
    block = np.array([[5.0, 1, 1], [1, 1, 1], [1, 1, 1]])
    np.testing.assert_allclose(model.ring_finish_s(block, np.full((3, 3), 0.1)), [7, 6.1, 3])


def test_paired_schedules_skip_what_no_query_sees():
    """Causal documents of 300 tokens, shards of 400: a rank needs only the tail of the document crossing its
    first cut, one round; documents aligned with the shards need nothing."""
    doc = np.repeat(np.arange(4), 300)
    for scheme in model.PAIRED:
        crossing = model.predict_step(model.LLAMA_3_2_1B, doc, np.full_like(doc, -1), [0, 400, 800, 1200], scheme)
        assert crossing.ring_steps == 1 and (crossing.comm_s > 0).all(), scheme
        alone = model.predict_step(model.LLAMA_3_2_1B, doc, np.full_like(doc, -1), [0, 300, 600, 900, 1200], scheme)
        assert alone.ring_steps == 0 and (alone.comm_s == 0).all() and (alone.wait_s == 0).all(), scheme


def test_across_two_nodes_the_hybrid_sends_each_shard_over_the_network_once():
    """One causal document over 2 nodes of 2 ranks, shards of 1024; everything free but the network (1 GB/s). Direct:
    rank 0's NIC sends its shard to both ranks of the other node, rank 3's receives two shards, in one round; back
    the same: 4 shards' time a layer. Ring: the cut between the nodes carries two shards, one a round: 4 as well.
    Hybrid: each shard crosses once, on its rail (rank 0 to 2, rank 1 to 3), and is handed on inside the node: 2."""
    ids = np.zeros(4096, np.int64)
    hardware = model.Hardware(gemm_tflops=math.inf, attention_forward_tflops=math.inf,
                              attention_training_tflops=math.inf, nvlink_gb_s=math.inf, network_gb_s=1.0,
                              latency_s=0.0, ranks_per_node=2)
    shard_s = 1024 * model.LLAMA_3_2_1B.kv_bytes_per_token / 1e9
    for scheme, shards in (("direct", 4), ("ring", 4), ("hybrid", 2)):
        step = model.predict_step(model.LLAMA_3_2_1B, ids, ids - 1, [0, 1024, 2048, 3072, 4096], scheme, hardware)
        assert step.step_s == pytest.approx(16 * shards * shard_s, rel=1e-12), scheme


def test_recompute_runs_each_layers_forward_again():
    """With activation recompute a step adds one layer forward of matmuls (not the LM head) and of attention and its
    exchange: on one GPU exactly the layers' forward matmuls and attention forward."""
    doc, grp = packed_vlm_ids(1, 2048, fresh_seed())
    sizes, hardware = model.LLAMA_3_2_1B, model.Hardware()
    plain = model.predict_step(sizes, doc.numpy(), grp.numpy(), 1, "all_gather", hardware)
    again = model.predict_step(sizes, doc.numpy(), grp.numpy(), 1, "all_gather", hardware, recompute=True)
    layers_forward = 2048 * (sizes.token_flops - 2 * sizes.hidden * sizes.vocab)  # FLOPs, the LM head's left out
    forward_attention = 16 * llama_pair_s(hardware, dense_rule(doc, grp).sum())[0]
    assert again.step_s - plain.step_s == pytest.approx(layers_forward / (hardware.gemm_tflops * 1e12)
                                                        + forward_attention, rel=1e-9)


@pytest.mark.parametrize("sizes", [model.LLAMA_3_2_1B, model.QWEN2_5_VL_3B], ids=lambda s: s.name)
def test_ulysses_in_one_node_splits_the_heads(sizes):
    world, length = 4, 512
    doc, grp = packed_vlm_ids(1, length, fresh_seed())
    hardware = model.Hardware(ranks_per_node=world)
    ulysses = model.predict_step(sizes, doc.numpy(), grp.numpy(), world, "ulysses", hardware)
    # Ulysses: even token shards; each GPU attends 1/W of the heads over the whole row; four all-to-alls a layer
    # (q, k, v forward then the output; the backward the same bytes), each GPU sending (W - 1) / W of its part
    assert ulysses.bounds == (0, 128, 256, 384, 512) and ulysses.ring_steps == 0
    kv_heads = max(sizes.kv_heads, world)  # K / V heads copied to every GPU whose query heads read them
    sent = 128 * (2 * sizes.q_heads + 2 * kv_heads) * sizes.head_dim * 2 * (world - 1) / world
    all_to_all = 2 * sent / (hardware.nvlink_gb_s * 1e9) + 4 * hardware.latency_s
    pair_flops = 4 * sizes.head_dim * sizes.q_heads * dense_rule(doc, grp).sum() / world  # forward, one layer
    attention = 3.5 * pair_flops / (hardware.attention_training_tflops * 1e12)  # forward + backward
    tokens = 128 * 3 * sizes.token_flops / (hardware.gemm_tflops * 1e12)
    np.testing.assert_allclose(ulysses.rank_s, tokens + sizes.layers * (attention + all_to_all), rtol=1e-12)


def measured(sizes, doc, grp, bounds, scheme, hardware, ranks_per_node, link_gb_s=None):
    """A `MeasuredRun` whose tokens/s ``hardware`` gives exactly."""
    run = model.MeasuredRun(sizes, model.RowLayout.of(doc, grp, bounds), scheme, ranks_per_node, link_gb_s, 1, True,
                            1.0)
    run.tokens_per_s = run.predicted_tokens_per_s(hardware)
    return run


def test_fit_recovers_the_constants_that_made_the_runs():
    """Runs made by a hardware 0.6x as fast at compute, with 120 GB/s NVLink and 80 us latency, on a small model
    and rows of long documents (so that transfers show): one GPU, 2 and 4 ranks of each schedule, 2 emulated nodes
    of 2 (their link fixed at 20 GB/s). From the defaults the fit finds those three constants; the network, which
    no run depends on, stays."""
    sizes = dataclasses.replace(model.LLAMA_3_2_1B, hidden=256, intermediate=512, vocab=1000, layers=2)
    truth = dataclasses.replace(model.Hardware(), gemm_tflops=360.0, attention_forward_tflops=240.0,
                                attention_training_tflops=198.0, nvlink_gb_s=120.0, latency_s=80e-6)
    doc = np.repeat(np.arange(3), [3000, 5000, 4288])[None]
    grp = np.full_like(doc, -1)
    runs = [measured(sizes, doc, grp, [0, 12288], "all_gather", truth, 1)]
    for scheme in ("all_gather", *model.PAIRED):
        runs.append(measured(sizes, doc, grp, [0, 5000, 12288], scheme, truth, 2))
        runs.append(measured(sizes, doc, grp, [0, 3500, 7000, 9500, 12288], scheme, truth, 2, link_gb_s=20.0))
    fitted, rms = model.fit(runs, parameters=model.FIT_PARAMETERS)
    assert rms < 1e-4
    for name in ("gemm_tflops", "attention_forward_tflops", "attention_training_tflops", "nvlink_gb_s", "latency_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=2e-3), name
    assert fitted.network_gb_s == model.Hardware().network_gb_s


def test_fit_reads_the_examples_records():
    """A launch's JSON as examples/context_parallel.py writes it (its runs, the row as runs of ids): each run
    becomes a measured run of that row, cuts, schedule, nodes and link."""
    result = {"model": "tiny", "sizes": dict(hidden=64, layers=2, q_heads=4, kv_heads=2, head_dim=16,
                                             intermediate=256, vocab=1000), "gpus": 4, "checkpointing": True,
              "runs": [{"schedule": schedule, "nodes": nodes, "link_gb_s": 45.0 if nodes == 2 else None,
                        "bounds": [0, 300, 500, 700, 1024], "tokens_per_s": 1000.0,
                        "row": {"doc_runs": [[[0, 600], [1, 400], [-1, 24]]],
                                "group_runs": [[[-1, 100], [0, 50], [-1, 874]]]}}
                       for schedule in ("hybrid", "direct") for nodes in (1, 2)]}
    runs = model.measured_runs([result])
    assert [(r.scheme, r.ranks_per_node, r.link_gb_s, r.data_ranks, r.recompute) for r in runs] == [
        ("hybrid", 4, None, 1, True), ("hybrid", 2, 45.0, 1, True), ("direct", 4, None, 1, True),
        ("direct", 2, 45.0, 1, True)]
    doc = runs[0].row.doc_ids[0]
    assert (doc[:600] == 0).all() and (doc[600:1000] == 1).all() and (doc[1000:] == -1).all()
    assert (runs[0].row.group_ids[0] >= 0).sum() == 50 and runs[0].row.bounds == (0, 300, 500, 700, 1024)


def test_cli_writes_its_json(tmp_path):
    model.main(["--lengths", "4096", "--ranks", "2", "4", "--out", str(tmp_path)])
    records = json.loads((tmp_path / "cost_model.json").read_text())["records"]
    cases = {(r["model"], r["layout"], r["ranks"], r["scheme"]) for r in records}
    expected = {(m, layout, w, s) for m in model.MODELS for layout in model.LAYOUTS
                for w, s in [(1, "one_gpu"), *((w, s) for w in (2, 4) for s in model.SCHEMES)]}
    assert cases == expected
    assert all(0 < r["speedup"] <= r["ranks"] * 1.0001 for r in records)
    assert "| best built |" in (tmp_path / "cost_model.md").read_text()


def test_the_best_schedule_is_the_fastest_predicted_and_never_an_all_gather_over_split_images():
    """Long documents over 2 nodes of 2 on a slow network: the model's choice is the schedule it predicts fastest;
    with a cut inside an image, the all-gather (which refuses such cuts) is not a candidate."""
    doc = np.repeat(np.arange(2), [3000, 1096])
    grp = np.full_like(doc, -1)
    grp[1500:1700] = 0
    hardware = model.Hardware(network_gb_s=1.0)
    for bounds, candidates in (([0, 1024, 2048, 3072, 4096], set(model.BUILT)),
                               ([0, 1024, 1600, 3072, 4096], set(model.PAIRED))):
        best, steps = model.best_schedule(model.LLAMA_3_2_1B, doc, grp, bounds, 2, hardware)
        assert steps.keys() == candidates and steps[best] == min(steps.values())
        split = dataclasses.replace(hardware, ranks_per_node=2)
        for scheme, step in steps.items():
            assert step == model.predict_step(model.LLAMA_3_2_1B, doc, grp, bounds, scheme, split).step_s
