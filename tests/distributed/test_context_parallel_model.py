"""The context-parallel cost model against brute-force pair counts and against figures derived by hand from its
definitions (FLOPs of a Llama layer, a ring's pipeline, Ulysses' all-to-all bytes); its CLI on a tiny setting."""

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
        if scheme == "hybrid":  # each GPU of a node: half the heads over the node's shard
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


@pytest.mark.parametrize("nvlink_gb_s", [1.0, 1e4])  # transfers longer than the blocks, then shorter
def test_ring_step_is_the_longer_of_compute_and_transfer(nvlink_gb_s):
    # one bidirectional image over the whole row: every (query shard, key shard) block holds (S / W)^2 pairs
    world, shard = 4, 1024
    ids = np.zeros(world * shard, np.int64)
    hardware = model.Hardware(gemm_tflops=math.inf, nvlink_gb_s=nvlink_gb_s, latency_s=0.0)
    bounds = list(range(0, world * shard + 1, shard))
    ring = model.predict_step(model.LLAMA_3_2_1B, ids, ids, bounds, "ring", hardware)
    forward, backward = llama_pair_s(hardware, shard**2)
    transfer = shard * 2 * 8 * 64 * 2 / (nvlink_gb_s * 1e9)  # K and V of 8 heads of 64, bf16
    layer = (forward + (world - 1) * max(forward, transfer)  # every step waits for the longer of the two
             + backward + (world - 1) * max(backward, 2 * transfer) + transfer)  # dK, dV travel too, then go home
    assert ring.ring_steps == world
    np.testing.assert_allclose(ring.rank_s, 16 * layer, rtol=1e-12)


def test_ring_waits_for_a_slow_neighbours_shard():
    # rank 0's first block takes 5: rank 1 gets shard 0 late and waits; rank 2 is never delayed
    block = np.array([[5.0, 1, 1], [1, 1, 1], [1, 1, 1]])
    np.testing.assert_allclose(model.ring_finish_s(block, np.full((3, 3), 0.1)), [7, 6.1, 3])


def test_ring_stops_after_the_last_step_a_rank_needs():
    doc = np.repeat(np.arange(4), 300)  # causal documents of 300 tokens, shards of 400: one step back at most
    ring = model.predict_step(model.LLAMA_3_2_1B, doc, np.full_like(doc, -1), [0, 400, 800, 1200], "ring")
    assert ring.ring_steps == 2 and (ring.comm_s > 0).all()
    alone = model.predict_step(model.LLAMA_3_2_1B, doc, np.full_like(doc, -1), [0, 300, 600, 900, 1200], "ring")
    assert alone.ring_steps == 1 and (alone.comm_s == 0).all() and (alone.wait_s == 0).all()  # nothing to pass on


@pytest.mark.parametrize("sizes", [model.LLAMA_3_2_1B, model.QWEN2_5_VL_3B], ids=lambda s: s.name)
def test_hybrid_in_one_node_is_ulysses(sizes):
    world, length = 4, 512
    doc, grp = packed_vlm_ids(1, length, fresh_seed())
    hardware = model.Hardware(ranks_per_node=world)
    hybrid = model.predict_step(sizes, doc.numpy(), grp.numpy(), world, "hybrid", hardware)
    # Ulysses: even token shards; each GPU attends 1/W of the heads over the whole row; four all-to-alls a layer
    # (q, k, v forward then the output; the backward the same bytes), each GPU sending (W - 1) / W of its part
    assert hybrid.bounds == (0, 128, 256, 384, 512) and hybrid.ring_steps == 0
    kv_heads = max(sizes.kv_heads, world)  # K / V heads copied to every GPU whose query heads read them
    sent = 128 * (2 * sizes.q_heads + 2 * kv_heads) * sizes.head_dim * 2 * (world - 1) / world
    all_to_all = 2 * sent / (hardware.nvlink_gb_s * 1e9) + 4 * hardware.latency_s
    pair_flops = 4 * sizes.head_dim * sizes.q_heads * dense_rule(doc, grp).sum() / world  # forward, one layer
    attention = 3.5 * pair_flops / (hardware.attention_training_tflops * 1e12)  # forward + backward
    tokens = 128 * 3 * sizes.token_flops / (hardware.gemm_tflops * 1e12)
    np.testing.assert_allclose(hybrid.rank_s, tokens + sizes.layers * (attention + all_to_all), rtol=1e-12)


def test_cli_writes_its_json(tmp_path):
    model.main(["--lengths", "4096", "--ranks", "2", "4", "--out", str(tmp_path)])
    records = json.loads((tmp_path / "cost_model.json").read_text())["records"]
    cases = {(r["model"], r["layout"], r["ranks"], r["scheme"]) for r in records}
    expected = {(m, layout, w, s) for m in model.MODELS for layout in model.LAYOUTS
                for w, s in [(1, "one_gpu"), *((w, s) for w in (2, 4) for s in model.SCHEMES)]}
    assert cases == expected
    assert all(0 < r["speedup"] <= r["ranks"] * 1.0001 for r in records)
    assert "| best |" in (tmp_path / "cost_model.md").read_text()
