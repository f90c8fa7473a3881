"""The overlapped schedules of context parallelism (direct, ring, hybrid) and the all-gather, on the CPU: the host's
plan against brute-force definitions (the pairs and key ranges from the dense token rule; every range delivered
from data its sender holds), then gloo ranks against float64 attention of the whole rows and against one process
running a stock model, at 2 ranks and at 2 x 2 (two nodes of an emulated link), on packed VLM rows whose images
cross the cuts, with padding, a whole shard of padding, and windows; the calls each rank runs are counted."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from benchmarks import context_parallel_model as cost_model
from omni_hf.distributed import SCHEDULES, ContextParallel, Topology
from omni_hf.distributed import exchange as exchange_module
from omni_hf.distributed.exchange import emulated_delays
from omni_hf.distributed.plan import Transfer, choose_schedule, pair_spans, plan_transfers, rank_plan
from tests.distributed.test_context_parallel import llama, packed_batch, run_example, run_ranks
from tests.helpers.brute_force import (
    naive_attention,
    packed_vlm_ids,
    random_token_ids,
    relative_error,
    token_rule_dense,
)

LENGTH = 600
PAIRED = ("direct", "ring", "hybrid")


def dense_spans(doc, grp, bounds, window) -> np.ndarray:
    """`pair_spans` from its definition: per (query shard, key shard) the first and last query row and key column
    of the dense token rule (over the batch) with an allowed pair; the diagonal wherever a shard has a real token."""
    allowed = token_rule_dense(doc, grp, doc.shape[1], window)[:, 0].any(0).numpy()
    shards = len(bounds) - 1
    spans = np.zeros((shards, shards, 4), np.int64)
    for r in range(shards):
        for s in range(shards):
            block = allowed[bounds[r]:bounds[r + 1], bounds[s]:bounds[s + 1]]
            if r == s:
                if (doc[:, bounds[r]:bounds[r + 1]] >= 0).any():
                    spans[r, r] = bounds[r], bounds[r + 1], bounds[r], bounds[r + 1]
            elif block.any():
                rows = bounds[r] + np.flatnonzero(block.any(1))
                cols = bounds[s] + np.flatnonzero(block.any(0))
                spans[r, s] = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
    return spans


def random_cuts(length: int, shards: int, rng: random.Random) -> list[int]:
    return [0, *sorted(rng.sample(range(1, length), shards - 1)), length]


@pytest.mark.parametrize("seed", range(12))
def test_pair_spans_are_the_dense_rules_ranges(seed):
    """Packed rows: exactly the dense rule's ranges, windows too. Ids whose documents recur after gaps, or groups
    that cross documents: exact without a window; with one, ranges that hold the rule's (a document's gap may sit
    inside) and are empty exactly where the rule's are."""
    rng = random.Random(seed)
    packed = seed % 2 == 0
    doc, grp = (packed_vlm_ids(2, 500, seed, image_range=(10, 80)) if packed else random_token_ids(2, 500, seed))
    bounds = random_cuts(500, rng.randint(1, 6), rng)
    for window in (None, 1, 40, 200):
        got, want = pair_spans(doc.numpy(), grp.numpy(), bounds, window), dense_spans(doc, grp, bounds, window)
        assert np.array_equal(got[..., 1] > got[..., 0], want[..., 1] > want[..., 0]), (bounds, window)
        if packed or window is None:
            assert np.array_equal(got, want), (bounds, window)
        else:
            kept = want[..., 1] > want[..., 0]
            assert (got[kept][:, [0, 2]] <= want[kept][:, [0, 2]]).all()
            assert (got[kept][:, [1, 3]] >= want[kept][:, [1, 3]]).all()


@pytest.mark.parametrize("seed", range(10))
def test_every_schedule_delivers_each_needed_range_from_data_its_sender_holds(seed):
    """Simulated round by round: a transfer's sender holds its range from an earlier round (or owns it), each rank
    receives a chunk once, and ends up holding every key range its queries need; direct sends from the owner in
    round 0, the ring to the next rank, the hybrid into each node once, to a rank that needs the range (the owner's
    rail rank where it does)."""
    rng = random.Random(seed)
    doc, grp = (packed_vlm_ids(2, 800, seed, image_range=(10, 80)) if seed % 2 else random_token_ids(2, 800, seed))
    nodes, per_node = rng.choice([1, 2, 4]), rng.choice([1, 2, 3])
    shards = nodes * per_node
    bounds = random_cuts(800, shards, rng)
    spans = pair_spans(doc.numpy(), grp.numpy(), bounds)
    topology = Topology(tuple(r // per_node for r in range(shards)))
    for schedule in PAIRED:
        held = {(r, r): (bounds[r], bounds[r + 1], -1) for r in range(shards)}
        transfers = plan_transfers(spans, schedule, topology)
        for t in transfers:
            start, stop, arrived = held[t.src, t.chunk]
            assert start <= t.start < t.stop <= stop and arrived < t.round, (schedule, t)
            assert (t.dst, t.chunk) not in held, (schedule, t)
            held[t.dst, t.chunk] = t.start, t.stop, t.round
            assert schedule != "direct" or (t.round == 0 and t.src == t.chunk)
            assert schedule != "ring" or t.dst == (t.src + 1) % shards
            if schedule == "hybrid" and t.src // per_node != t.dst // per_node:  # into a node once, to a rank
                entries = [u for u in transfers if u.chunk == t.chunk and u.dst // per_node == t.dst // per_node]
                assert spans[t.dst, t.chunk, 1] > spans[t.dst, t.chunk, 0] and entries[0] == t, t  # that needs it
                rail = t.dst - t.dst % per_node + t.chunk % per_node
                assert t.dst == rail or spans[rail, t.chunk, 1] == spans[rail, t.chunk, 0], t  # the rail, if it can
        for r in range(shards):
            for chunk in range(shards):
                q0, q1, k0, k1 = spans[r, chunk]
                if q1 > q0 and r != chunk:
                    assert held[r, chunk][0] <= k0 and k1 <= held[r, chunk][1], (schedule, r, chunk)


def test_a_rank_computes_exactly_the_pairs_with_an_allowed_pair():
    """Documents of 100 tokens, no images, then padding from 450: a shard's queries see only the shard before it
    (the document crossing their first cut), the shard of padding nothing; the plan skips the rest and sends only
    the keys of the documents crossing a cut."""
    doc = torch.repeat_interleave(torch.arange(6), 100)[None].int()
    doc[:, 450:] = -1
    grp = torch.full_like(doc, -1)
    bounds = [0, 150, 350, 450, 600]
    spans = pair_spans(doc.numpy(), grp.numpy(), bounds)
    transfers = plan_transfers(spans, "direct", Topology((0, 0, 0, 0)))
    assert transfers == (Transfer(0, 0, 1, 0, 100, 150), Transfer(0, 1, 2, 1, 300, 350))
    plans = [rank_plan(spans, transfers, r) for r in range(4)]
    assert [[(p.chunk, p.queries, p.keys) for p in plan.pairs] for plan in plans] == [
        [(0, (0, 150), (0, 150))],
        [(1, (150, 350), (150, 350)), (0, (150, 200), (100, 150))],
        [(2, (350, 450), (350, 450)), (1, (350, 400), (300, 350))],
        []]
    assert [plan.skipped for plan in plans] == [3, 2, 2, 4]


def test_topologies_and_the_automatic_choice():
    assert Topology.emulated(4, 2).node_of == (0, 0, 1, 1) and Topology.emulated(4, 2).link_gb_s == 45.0
    assert Topology.emulated(4, 1).link_gb_s is None  # one node: nothing to emulate
    assert choose_schedule(Topology((0, 0, 0))) == "direct"
    assert choose_schedule(Topology((0, 0, 0)), gatherable=True) == "all_gather"
    assert choose_schedule(Topology((0, 0, 1, 1)), gatherable=True) == "hybrid"
    assert choose_schedule(Topology((0, 0, 1, 1))) == "hybrid"
    assert choose_schedule(Topology((0, 0, 0, 1))) == "ring"  # no rails
    with pytest.raises(ValueError, match="nodes: expected a divisor of the 4 ranks, got 3"):
        Topology.emulated(4, 3)
    with pytest.raises(ValueError, match=r"topology: the hybrid schedule needs nodes of equal size .*\[3, 1\]"):
        plan_transfers(np.ones((4, 4, 4), np.int64) * [0, 1, 0, 1], "hybrid", Topology((0, 0, 0, 1)))
    with pytest.raises(ValueError, match="schedule: expected 'auto' or one of .*got 'rings'"):
        ContextParallel(torch.zeros(1, 8, dtype=torch.int32), torch.zeros(1, 8, dtype=torch.int32), (0, 4, 8), 0,
                        schedule="rings")


def test_emulated_delays_are_the_bytes_over_the_links_rate():
    """Rank 2 of nodes (0, 0, 1, 1) receives 30 tokens from rank 0 and 50 from rank 1 in round 0 (rank 1 also sends
    100 to rank 3), 20 from rank 3 in round 1 (same node: no delay); at 1000 bytes a token and 1e-6 GB/s, a
    round takes the larger of its own cross-node bytes and its busiest sender's, over the rate."""
    topology = Topology((0, 0, 1, 1), link_gb_s=1e-6)
    transfers = (Transfer(0, 0, 2, 0, 0, 30), Transfer(0, 1, 2, 1, 100, 150), Transfer(0, 1, 3, 1, 0, 100),
                 Transfer(1, 3, 2, 3, 0, 20))
    assert emulated_delays(transfers, 2, topology, 2, 1000, backward=False) == pytest.approx([150 * 1000 / 1e3, 0.0])
    # backward: dK / dV go back; rank 2 sends 80 tokens to node 0 and receives none, rank 0 gets 30 from it
    assert emulated_delays(transfers, 2, topology, 2, 1000, backward=True) == pytest.approx([0.0, 0.0])
    assert emulated_delays(transfers, 0, topology, 2, 1000, backward=True) == pytest.approx([80.0, 0.0])
    assert emulated_delays(transfers, 0, dataclasses.replace(topology, link_gb_s=None), 2, 1000, False) == [0, 0]


# ---------------------------------------------------------------------- gloo ranks against float64


def image_splitting_cuts(doc: torch.Tensor, grp: torch.Tensor, shards: int) -> list[int]:
    """Cuts near equal shares of the row, each moved into the middle of the nearest image of row 0."""
    images = [(int(g), int((grp[0] == g).nonzero()[0]), int((grp[0] == g).nonzero()[-1]) + 1)
              for g in grp[0].unique() if g >= 0]
    cuts = [0]
    for rank in range(1, shards):
        target = rank * doc.shape[1] // shards
        _, start, stop = min(images, key=lambda image: abs((image[1] + image[2]) // 2 - target))
        cuts.append((start + stop) // 2)
    return cuts + [doc.shape[1]]


CASES = {  # name: (schedule, window, cuts, images: whether image groups attend both ways)
    "all_gather": ("all_gather", None, "balanced", True),
    "direct": ("direct", None, "images", True),
    "ring, window": ("ring", 50, "images", True),
    "hybrid": ("hybrid", None, "images", True),
    "direct, padding shard": ("direct", None, "padding", True),
    "hybrid, window, padding shard": ("hybrid", 70, "padding", True),
    "direct, images causal": ("direct", None, "images", False),  # a layer that keeps images causal (Gemma 4's global)
    "all_gather, images causal": ("all_gather", None, "balanced", False),
}


def case_inputs(world_size: int, cuts: str):
    """float32 q [2, 4, L, 16], k, v [2, 2, L, 16], dout; ids of packed VLM rows (padding at the ends); the cuts."""
    gen = torch.Generator().manual_seed(world_size)
    q, dout = (torch.randn(2, 4, LENGTH, 16, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 2, LENGTH, 16, generator=gen) for _ in range(2))
    doc, grp = packed_vlm_ids(2, LENGTH, world_size, doc_range=(80, 300), image_range=(20, 90))
    if cuts == "padding":  # the last shard all padding
        doc[:, LENGTH - 100:] = -1
        grp[:, LENGTH - 100:] = -1
        bounds = [*image_splitting_cuts(doc[:, :LENGTH - 100], grp[:, :LENGTH - 100], world_size - 1), LENGTH]
    elif cuts == "images":
        bounds = image_splitting_cuts(doc, grp, world_size)
    else:
        bounds = None
    return q, k, v, dout, doc, grp, bounds


def schedules_rank(rank, world_size, nodes):
    """Every case on this rank: outputs, gradients, the calls run forward and backward, the plan's pairs."""
    calls = {"forward": 0, "backward": 0}
    forward, backward = exchange_module.forward_call, exchange_module.backward_call

    def counted(name, function):
        def call(*args):
            calls[name] += 1
            return function(*args)
        return call

    exchange_module.forward_call = counted("forward", forward)
    exchange_module.backward_call = counted("backward", backward)
    results = {}
    for name, (schedule, window, cuts, images) in CASES.items():
        q, k, v, dout, doc, grp, bounds = case_inputs(world_size, cuts)
        cp = ContextParallel.for_batch(doc, grp, window=window, schedule=schedule)
        topology = Topology.emulated(world_size, nodes, link_gb_s=50.0)
        cp = dataclasses.replace(cp, bounds=tuple(bounds or cp.bounds), topology=topology)
        local = [cp.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
        calls.update(forward=0, backward=0)
        out = cp.attention(*local, window=window, images=images)
        out.backward(cp.shard(dout, dim=2))
        planned = cp if images else cp.without_images()
        pairs = [] if schedule == "all_gather" else [p.chunk for p in planned.plan(window=window)[0].pairs]
        results[name] = {"bounds": cp.bounds, "out": out.detach(), "dq": local[0].grad, "dk": local[1].grad,
                         "dv": local[2].grad, "calls": dict(calls), "pairs": pairs}
    return results


@pytest.mark.slow
@pytest.mark.parametrize("world_size, nodes", [(2, 1), (4, 2)], ids=["2 ranks", "2 nodes x 2 ranks"])
def test_every_schedule_equals_float64_attention_of_the_whole_rows(world_size, nodes, tmp_path):
    """Each case's outputs and dq, dk, dv, joined over the ranks, within 1e-6 of float64 attention of the whole rows
    (float32 sums, one merge per pair); each rank runs one call forward and one backward per pair it has an allowed
    pair in, per the dense rule, and no other."""
    ranks = run_ranks(world_size, schedules_rank, tmp_path, nodes)
    for name, (schedule, window, cuts, images) in CASES.items():
        q, k, v, dout, doc, grp, _ = case_inputs(world_size, cuts)
        bounds = ranks[0][name]["bounds"]
        allowed = token_rule_dense(doc, grp if images else torch.full_like(grp, -1), LENGTH, window)
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        want, _ = naive_attention(*leaves, allowed, 16 ** -0.5)
        want.backward(dout.double())
        got = {key: torch.cat([r[name][key] for r in ranks], dim=2) for key in ("out", "dq", "dk", "dv")}
        for key, expected in zip(("out", "dq", "dk", "dv"), (want, *(t.grad for t in leaves))):
            assert relative_error(got[key], expected) <= 1e-6, (name, key)
        if cuts == "images":
            assert any((grp[0, a - 1] == grp[0, a]) & (grp[0, a] >= 0) for a in bounds[1:-1]), name
        if schedule == "all_gather":
            continue
        dense = allowed[:, 0].any(0)
        for r, result in enumerate(ranks):
            shards = [s for s in range(world_size) if dense[bounds[r]:bounds[r + 1], bounds[s]:bounds[s + 1]].any()
                      or (s == r and (doc[:, bounds[r]:bounds[r + 1]] >= 0).any())]
            assert sorted(result[name]["pairs"]) == shards, (name, r)
            assert result[name]["calls"] == {"forward": len(shards), "backward": len(shards)}, (name, r)
    assert ranks[-1]["direct, padding shard"]["calls"] == {"forward": 0, "backward": 0}  # nothing to attend


# ---------------------------------------------------------------------- a stock model at 2 x 2


def model_rank(rank, world_size, schedules):
    """Llama's loss and averaged gradients on this rank's shard of a packed row cut inside images, per schedule."""
    model = llama()
    batch = packed_batch(world_size)
    results = {}
    for schedule in schedules:
        cp = ContextParallel.for_batch(batch["omni_doc_ids"], batch["omni_group_ids"], schedule=schedule)
        bounds = image_splitting_cuts(batch["omni_doc_ids"], batch["omni_group_ids"], world_size)
        cp = dataclasses.replace(cp, bounds=tuple(bounds), topology=Topology.emulated(world_size, 2, 50.0))
        loss = model(**cp.shard_batch(batch)).loss
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        loss = loss.detach()
        for total in (loss, *grads.values()):
            dist.all_reduce(total)
            total /= world_size
        results[schedule] = {"loss": loss, "grads": grads, "bounds": bounds}
    return results


@pytest.mark.slow
def test_a_stock_model_on_two_nodes_of_two_gives_the_whole_rows_loss_and_gradients(tmp_path):
    """Llama on a packed interleaved row over 2 x 2 ranks (an emulated link between the pairs), cuts inside images:
    ring, hybrid and direct each give one process's loss (1e-6) and every parameter gradient (1e-5)."""
    model = llama()
    batch = packed_batch(4)
    loss = model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                 omni_doc_ids=batch["omni_doc_ids"], omni_group_ids=batch["omni_group_ids"]).loss
    loss.backward()
    ranks = run_ranks(4, model_rank, tmp_path, PAIRED)
    grp = batch["omni_group_ids"]
    for schedule in PAIRED:
        result = ranks[0][schedule]
        assert any(grp[0, a - 1] == grp[0, a] >= 0 for a in result["bounds"][1:-1]), "no image crosses a cut"
        assert relative_error(result["loss"], loss.detach()) <= 1e-6, schedule
        for name, p in model.named_parameters():
            assert relative_error(result["grads"][name], p.grad) <= 1e-5, (schedule, name)


# ---------------------------------------------------------------------- the emulated link


def slow_link_rank(rank, world_size, link_gb_s):
    """Seconds of a direct exchange of one layer's keys over 2 emulated nodes, and the bytes that crossed."""
    doc = torch.zeros(1, 2000, dtype=torch.int32)  # one document: rank 1 needs all of rank 0's keys
    cp = ContextParallel(doc, torch.full_like(doc, -1), (0, 1000, 2000), rank, schedule="direct",
                         topology=Topology.emulated(2, 2, link_gb_s))
    q, k, v = (torch.randn(1, 2, 1000, 32) for _ in range(3))
    cp.attention(q, k, v)  # the plan, the masks: built once
    dist.barrier()
    start = time.perf_counter()
    cp.attention(q, k, v)
    return {"seconds": time.perf_counter() - start, "bytes": 1000 * 2 * 2 * 32 * 4}


@pytest.mark.slow
def test_an_emulated_link_holds_the_transfer_to_its_rate(tmp_path):
    """Rank 1 receives 0.5 MB of keys and values across the emulated link: at 0.001 GB/s that takes 0.5 s, which
    its attention waits for; rank 0 receives nothing."""
    ranks = run_ranks(2, slow_link_rank, tmp_path, 1e-3)
    assert ranks[1]["seconds"] >= ranks[1]["bytes"] / 1e6 > 0.5 * 0.99
    assert ranks[0]["seconds"] < ranks[1]["bytes"] / 1e6


def test_all_gather_refuses_cuts_that_split_an_image():
    doc = torch.zeros(1, 40, dtype=torch.int32)
    grp = torch.full_like(doc, -1)
    grp[:, 15:25] = 0
    cp = ContextParallel(doc, grp, (0, 20, 40), 0, schedule="all_gather", topology=Topology((0, 0)))
    with pytest.raises(ValueError, match=r"schedule: 'all_gather' needs cuts between images, but bounds \(0, 20, 40\) "
                                         r"split one \(queries of shard 0 see keys of shard 1\)"):
        cp.attention(*(torch.zeros(1, 2, 20, 8) for _ in range(3)))



@pytest.mark.slow
def test_the_example_times_each_schedule_on_emulated_nodes_and_checks_one_process(tmp_path):
    """examples/context_parallel.py on 4 ranks, FSDP2, every schedule on the real links and on 2 emulated nodes of 2:
    the first schedule's loss and gradients are one process's (float32), each run is recorded with its nodes, and a
    run on the emulated nodes with its tokens/s against the same schedule's on the real links."""
    result = run_example(tmp_path, 4, "--check", "--length", "1024", "--steps", "1", "--warmup", "0", "--workers", "1",
                         "--emulate-nodes", "1", "2", "--schedule", "hybrid", "ring", "direct", "all_gather",
                         "--sample-tokens", "300", "900")
    assert result["loss_rel_diff"] <= 1e-6 and result["grad_rel_diff"] <= 1e-5, result
    runs = {(run["schedule"], run["nodes"]): run for run in result["runs"]}
    assert runs.keys() == {(schedule, nodes) for schedule in SCHEDULES for nodes in (1, 2)}
    for (schedule, nodes), run in runs.items():
        assert run["link_gb_s"] == (45.0 if nodes == 2 else None)
        if nodes == 2:
            assert run["vs_nvlink"] == pytest.approx(run["tokens_per_s"] / runs[schedule, 1]["tokens_per_s"])
        if schedule != "all_gather":  # rank 0 attends only its own keys; the others some of their predecessors'
            assert run["pairs_computed"][0] == 1 and min(run["pairs_computed"][1:]) >= 2
    runs = cost_model.measured_runs([result])  # the records the cost model is fitted to
    assert [(r.scheme, r.row.bounds, r.tokens_per_s) for r in runs] == [
        (run["schedule"], tuple(run["bounds"]), run["tokens_per_s"]) for run in result["runs"]]
    assert all(r.row.tokens.sum() == 1024 and r.data_ranks == 1 and r.recompute for r in runs)
    _, before = cost_model.fit(runs, parameters=())
    assert cost_model.fit(runs)[1] <= before
