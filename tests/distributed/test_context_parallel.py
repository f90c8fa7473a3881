"""Context parallelism on the CPU: gloo process groups of 2-4 ranks running the exact reference path must
give what one process gives, for attention alone (outputs, dq, dk, dv), for a stock Transformers model on a packed
interleaved batch (loss and every parameter gradient), and under the engines (DDP, FSDP2 on a data x context mesh,
through examples/context_parallel.py); the shard cuts never split an image group and balance the work. Ranks run as
spawned processes and write their results for the test process to compare. On a machine with two GPUs the example
also runs on NCCL."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, Gemma4TextConfig, LlamaConfig

import omni_hf  # noqa: F401  (registers "omni")
from omni_hf import OmniBlockMask, OmniCollator, omni_attention
from omni_hf.distributed import (
    ContextParallel,
    ContextParallelCollator,
    allowed_keys_per_query,
    balanced_bounds,
    token_work_in_pairs,
)
from tests.helpers.brute_force import random_token_ids, relative_error, token_rule_dense

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "context_parallel.py"

LENGTH = 600


def packed_ids(seed: int, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [batch, LENGTH] doc / group ids of packed documents (40-250 tokens) with images (8-60 tokens, unique
    group ids, text between them) and padding at the end of the rows."""
    gen = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=gen))

    doc = torch.full((batch, LENGTH), -1, dtype=torch.int32)
    grp = torch.full((batch, LENGTH), -1, dtype=torch.int32)
    for b in range(batch):
        start, document, group, end_of_row = 0, 0, 0, LENGTH - draw(0, 60)
        while start < end_of_row:
            end = min(start + draw(40, 250), end_of_row)
            doc[b, start:end] = document
            image = start + draw(1, 30)
            while image < end - 8:
                size = min(draw(8, 60), end - image)
                grp[b, image:image + size] = group
                group += 1
                image += size + draw(5, 40)
            start, document = end, document + 1
    return doc, grp


# ---------------------------------------------------------------------- cuts and work


@pytest.mark.parametrize("window", [None, 1, 64])
@pytest.mark.parametrize("seed", range(6))
def test_allowed_keys_per_query_counts_the_token_rule(seed, window):
    """Against the dense rule, on rows whose documents and groups recur after gaps and cross each other."""
    doc, grp = random_token_ids(2, LENGTH, seed)
    counts = allowed_keys_per_query(doc.numpy(), grp.numpy(), window)
    assert np.array_equal(counts, token_rule_dense(doc, grp, LENGTH, window).sum(-1)[:, 0].numpy())


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("seed", range(6))
def test_balanced_bounds_never_split_a_group_and_balance_the_work(seed, world_size):
    doc, grp = packed_ids(seed)
    cuts = balanced_bounds(doc.numpy(), grp.numpy(), world_size)
    assert cuts[0] == 0 and cuts[-1] == LENGTH and all(b > a for a, b in zip(cuts, cuts[1:]))
    for cut in cuts[1:-1]:  # no (document, group) pair of any row on both sides of a cut
        for b in range(doc.shape[0]):
            left = {(int(d), int(g)) for d, g in zip(doc[b, :cut], grp[b, :cut]) if d >= 0 and g >= 0}
            right = {(int(d), int(g)) for d, g in zip(doc[b, cut:], grp[b, cut:]) if d >= 0 and g >= 0}
            assert not left & right, f"the cut at {cut} splits a group of row {b}"


def test_the_shares_of_a_row_without_images_are_within_one_query_of_equal():
    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([100, 250, 50, 200]))[None].int()
    grp = torch.full_like(doc, -1)
    work = allowed_keys_per_query(doc.numpy(), grp.numpy()).sum(0)
    cuts = balanced_bounds(doc.numpy(), grp.numpy(), 3)
    shares = [int(work[a:b].sum()) for a, b in zip(cuts, cuts[1:])]
    assert max(shares) - min(shares) <= 2 * work.max()


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_a_large_token_cost_balances_tokens(world_size):
    """When each token's own work dwarfs its attention, the shares are equal in tokens (to one token)."""
    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([100, 250, 50, 200]))[None].int()
    grp = torch.full_like(doc, -1)
    cuts = balanced_bounds(doc.numpy(), grp.numpy(), world_size, token_cost=1e9)
    assert all(abs(cut - rank * 600 / world_size) <= 1 for rank, cut in enumerate(cuts))


def test_a_negative_token_cost_is_refused():
    doc = torch.zeros(1, 40, dtype=torch.int32)
    with pytest.raises(ValueError, match="token_cost: expected a finite cost >= 0.*got -1"):
        balanced_bounds(doc.numpy(), (doc - 1).numpy(), 2, token_cost=-1)


@pytest.mark.parametrize("kv_heads, head_dim", [(4, 16), (2, 16), (1, 24)])
def test_token_work_in_pairs_matches_counted_flops(kv_heads, head_dim):
    """One token through a model with eager attention: its counted matmul FLOPs are the token's own work plus one
    (q, k) pair per layer (the token attends itself), so their ratio to one pair's FLOPs is the token cost + 1. The
    rotary embedding's angles (positions times inverse frequencies) are no work of the token's width: some
    Transformers versions (5.17) compute them by a matmul that the counter sees, so they are left out."""
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with FlopCounterMode(display=False) as counter:
        model(input_ids=torch.tensor([[5]]))
    rotary = sum(sum(ops.values()) for name, ops in counter.get_flop_counts().items() if name.endswith("rotary_emb"))
    pair = config.num_hidden_layers * 4 * config.num_attention_heads * head_dim
    assert token_work_in_pairs(config) == pytest.approx((counter.get_total_flops() - rotary) / pair - 1, rel=1e-12)


def test_an_empty_shard_is_refused():
    doc = torch.zeros(1, 40, dtype=torch.int32)
    grp = torch.zeros(1, 40, dtype=torch.int32)  # one image over the whole row: no valid cut
    with pytest.raises(ValueError, match="empty shard"):
        balanced_bounds(doc.numpy(), grp.numpy(), 2)


# ---------------------------------------------------------------------- shards made in a DataLoader


def interleaved_samples(seed: int) -> list[dict]:
    """Five samples of 60-200 tokens (ids below 100), each with a 30-token image span (bidirectional)."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for length in (90, 140, 60, 200, 110):
        ids = torch.randint(1, 100, (length,), generator=gen).tolist()
        start = int(torch.randint(5, length - 40, (1,), generator=gen))
        samples.append({"input_ids": ids, "modality_spans": [(start, start + 30)]})
    return samples


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_collator_gives_each_rank_the_shard_of_the_whole_batch(world_size):
    """Through a DataLoader worker (the shard is pickled back): each rank's batch is `shard_batch` of the whole
    collated row at `balanced_bounds`' cuts, with no process group yet."""
    pack = OmniCollator(pad_token_id=0, mode="pack", max_length=640, pad_to_multiple_of=640)
    samples = interleaved_samples(world_size)
    whole = pack(samples)
    doc, grp = whole["omni_doc_ids"].numpy(), whole["omni_group_ids"].numpy()
    bounds = balanced_bounds(doc, grp, world_size, token_cost=7.5)
    for rank in range(world_size):
        collate = ContextParallelCollator(pack, world_size, rank, token_cost=7.5)
        (got,) = torch.utils.data.DataLoader([samples], batch_size=None, collate_fn=collate, num_workers=1)
        cp = got.pop("omni_context_parallel")
        assert cp.bounds == tuple(bounds) and cp.rank == rank and cp.group is None
        assert torch.equal(cp.doc_ids, whole["omni_doc_ids"].int()) and torch.equal(cp.group_ids,
                                                                                   whole["omni_group_ids"].int())
        start, stop = bounds[rank], bounds[rank + 1]
        for key in ("input_ids", "position_ids", "labels"):
            assert torch.equal(got[key], whole[key][:, start:stop]), key
        next_labels = torch.nn.functional.pad(whole["labels"], (0, 1), value=-100)[:, start + 1:stop + 1]
        assert torch.equal(got["shift_labels"], next_labels)
        labelled = (torch.nn.functional.pad(whole["labels"][:, 1:], (0, 1), value=-100) != -100).sum()
        assert got["num_items_in_batch"].item() == pytest.approx(labelled.item() / world_size)


def test_a_shard_moves_and_takes_its_group():
    doc, grp = packed_ids(0)
    cp = ContextParallel(doc, grp, (0, 300, LENGTH), 1, cache={("mask", None, "cpu"): 1})
    spans = cp.spans()
    moved = cp.to("cpu", group="the row's group")
    assert moved.group == "the row's group" and moved.bounds == cp.bounds
    assert moved.cache.keys() == {("spans", None)} and moved.spans() is spans  # the host's plan stays, masks go
    assert moved.to("cpu").group == "the row's group"  # no group given: the shard keeps its own
    assert pickle.loads(pickle.dumps(cp)).bounds == cp.bounds


@pytest.mark.parametrize("world_size, rank, token_cost, message", [
    (2, 2, 0.0, "rank: expected 0 <= rank < world_size = 2, got 2"),
    (0, 0, 0.0, "world_size: expected the number of ranks sharing a row .>= 1., got 0"),
    (2, 0, float("nan"), "token_cost: expected a finite cost >= 0 .* got nan"),
])
def test_a_collator_with_bad_arguments_is_refused(world_size, rank, token_cost, message):
    with pytest.raises(ValueError, match=message):
        ContextParallelCollator(OmniCollator(pad_token_id=0), world_size, rank, token_cost=token_cost)


def test_a_shard_rank_outside_its_bounds_is_refused():
    doc, grp = packed_ids(0)
    with pytest.raises(ValueError,
                       match=r"rank: expected 0 <= rank < 2 \(the shards of bounds \(0, 300, 600\)\), got 2"):
        ContextParallel(doc, grp, (0, 300, LENGTH), 2)


def test_token_work_in_pairs_refuses_a_config_without_a_dense_mlp():
    with pytest.raises(ValueError, match="config: expected a dense decoder config with intermediate_size"):
        token_work_in_pairs(SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=10))


def group_rank(rank, world_size):
    """A shard of a three-rank row bound to this two-rank group is refused, naming the group's size and rank."""
    doc, grp = packed_ids(0)
    cp = ContextParallel(doc, grp, (0, 200, 400, LENGTH), rank)
    try:
        cp.to("cpu", group=None)  # the default group, checked
    except ValueError as err:
        return {"error": str(err)}
    return {"error": None}


def test_a_shard_bound_to_a_group_of_another_size_is_refused(tmp_path):
    for rank, got in enumerate(run_ranks(2, group_rank, tmp_path)):
        assert got["error"] == (f"group: expected the row's 3 ranks with this process as rank {rank}, got 2 ranks with "
                                f"this process as rank {rank} (pass the context-parallel group, e.g. "
                                "mesh['cp'].get_group())")


# ---------------------------------------------------------------------- ranks


def run_ranks(world_size: int, target, tmp_path, *args) -> list[dict]:
    """Spawn ``world_size`` gloo ranks running ``target(rank, world_size, out_file, *args)``; their results."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    mp.start_processes(_rank_main, args=(world_size, target, str(tmp_path), args), nprocs=world_size,
                       start_method="spawn")
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world_size)]


def _rank_main(rank, world_size, target, folder, args):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    try:
        torch.save(target(rank, world_size, *args), os.path.join(folder, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def attention_inputs(seed: int):
    """float32 q [2, 4, L, 32], k, v [2, 2, L, 32], dout, and the rows' ids."""
    gen = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(2, 4, LENGTH, 32, generator=gen) for _ in range(2))
    k, v = (torch.randn(2, 2, LENGTH, 32, generator=gen) for _ in range(2))
    return q, k, v, dout, *packed_ids(seed)


def attention_rank(rank, world_size, seed, window):
    q, k, v, dout, doc, grp = attention_inputs(seed)
    cp = ContextParallel.for_batch(doc, grp, window=window)
    local = [cp.shard(t, dim=2).clone().requires_grad_() for t in (q, k, v)]
    out = cp.attention(*local, window=window)
    out.backward(cp.shard(dout, dim=2))
    return {"bounds": cp.bounds, "out": out.detach(), "dq": local[0].grad, "dk": local[1].grad, "dv": local[2].grad}


@pytest.mark.slow
@pytest.mark.parametrize("world_size, window", [(2, None), (3, 50), (4, None)])
def test_sharded_attention_equals_the_whole_rows(world_size, window, tmp_path):
    q, k, v, dout, doc, grp = attention_inputs(world_size)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = omni_attention(*leaves, OmniBlockMask.from_token_ids(doc, grp, window=window))
    expected.backward(dout)
    ranks = run_ranks(world_size, attention_rank, tmp_path, world_size, window)
    assert all(r["bounds"] == ranks[0]["bounds"] for r in ranks)
    got = {name: torch.cat([r[name] for r in ranks], dim=2) for name in ("out", "dq", "dk", "dv")}
    for name, want in zip(("out", "dq", "dk", "dv"), (expected.detach(), *(t.grad for t in leaves))):
        # the same float32 sums but for masked keys (exact zeros) and dK / dV's sum over ranks (another order)
        assert relative_error(got[name], want) <= 1e-6, name


# ---------------------------------------------------------------------- a stock model


def llama(seed: int = 0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024)
    return AutoModelForCausalLM.from_config(config, attn_implementation="omni")


def gemma4(seed: int = 0):
    """Gemma 4's language model: a global layer (head dim 32) then a sliding one (window 40), image blocks asked for
    by ``use_bidirectional_attention="vision"`` (in its sliding layers only, from Transformers 5.24). The global
    layer comes first so that its rule for image tokens reaches the loss, which image positions do not carry."""
    torch.manual_seed(seed)
    config = Gemma4TextConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                              sliding_window=40, layer_types=["full_attention", "sliding_attention"],
                              hidden_size_per_layer_input=8, vocab_size_per_layer_input=100,
                              use_bidirectional_attention="vision", pad_token_id=0, max_position_embeddings=1024)
    return AutoModelForCausalLM.from_config(config, attn_implementation="omni")


MODELS = {"llama": llama, "gemma4": gemma4}


def packed_batch(seed: int) -> dict:
    """One packed row of `interleaved_samples` from the collator."""
    return OmniCollator(pad_token_id=0, mode="pack", max_length=640, pad_to_multiple_of=640)(interleaved_samples(seed))


def model_rank(rank, world_size, seed, family):
    model = MODELS[family]()
    batch = packed_batch(seed)
    cp = ContextParallel.for_batch(batch["omni_doc_ids"], batch["omni_group_ids"])
    loss = model(**cp.shard_batch(batch)).loss
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    loss = loss.detach()
    for total in (loss, *grads.values()):  # the ranks' losses and gradients average to the row's
        dist.all_reduce(total)
        total /= world_size
    return {"loss": loss, "grads": grads}


@pytest.mark.slow
@pytest.mark.parametrize("world_size, family", [(2, "llama"), (3, "llama"), (2, "gemma4")])
def test_a_stock_model_on_shards_gives_the_whole_rows_loss_and_gradients(world_size, family, tmp_path):
    """Llama, and Gemma 4's language model (its global layer keeps images causal where its sliding one attends them
    both ways), on a packed interleaved row: each rank runs its shard (positions, labels shifted across the cuts,
    the row's label count over the ranks), the averaged losses and gradients equal one process's on the whole row."""
    model = MODELS[family]()
    batch = packed_batch(world_size)
    loss = model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                 attention_mask=batch.get("attention_mask"), omni_doc_ids=batch["omni_doc_ids"],
                 omni_group_ids=batch["omni_group_ids"]).loss
    loss.backward()
    ranks = run_ranks(world_size, model_rank, tmp_path, world_size, family)
    assert relative_error(ranks[0]["loss"], loss.detach()) <= 1e-6
    for name, p in model.named_parameters():
        assert relative_error(ranks[0]["grads"][name], p.grad) <= 1e-5, name


# ---------------------------------------------------------------------- the engines (examples/context_parallel.py)


def run_example(tmp_path, ranks: int, *args: str) -> dict:
    """examples/context_parallel.py under torchrun with ``ranks`` processes; its JSON."""
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                    str(EXAMPLE), "--json", str(out), *args], check=True, env=env, timeout=900)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("ranks, cp, engine, length", [(2, 2, "fsdp2", 2048), (4, 2, "fsdp2", 1024),
                                                        (4, 2, "ddp", 1024)])
def test_the_engines_give_one_process_loss_and_gradients(ranks, cp, engine, length, tmp_path):
    """FSDP2 / DDP over every rank, rows shared by ``cp`` ranks (and ``ranks / cp`` rows at a time): the engine's
    averaged loss and gradients equal one process running each whole row (float32, exact reference path)."""
    result = run_example(tmp_path, ranks, "--check", "--engine", engine, "--cp", str(cp), "--length", str(length),
                         "--steps", "1", "--warmup", "0", "--workers", "1")
    assert result["loss_rel_diff"] <= 1e-6 and result["grad_rel_diff"] <= 1e-5, result
    assert result["grad_noise"] <= 1e-5, result  # the same samples packed in reverse order: float32 rounding only
    assert sum(result["per_rank"]["tokens"]) == length * ranks // cp


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("engine", ["fsdp2", "ddp", "accelerate"])
def test_the_engines_on_two_gpus_give_one_process_loss(engine, tmp_path):
    """NCCL, bf16 kernels: the loss within 1e-3 relative of one process's, gradients within bf16 noise."""
    if engine == "accelerate":
        pytest.importorskip("accelerate", reason="python3 -m pip install -e '.[train]'")
    result = run_example(tmp_path, 2, "--device", "cuda", "--check", "--engine", engine, "--length", "16384",
                         "--steps", "2", "--warmup", "1")
    assert result["loss_rel_diff"] <= 1e-3 and result["grad_rel_diff"] <= 2e-2, result


def same_row_rank(rank, world_size):
    """`check_same_row` of the example on shards of one row, then of rows that differ by rank."""
    from examples.context_parallel import check_same_row

    doc, grp = packed_ids(0)
    check_same_row(ContextParallel(doc, grp, (0, 300, LENGTH), rank))
    try:
        check_same_row(ContextParallel(doc + rank, grp, (0, 300, LENGTH), rank))
    except SystemExit as err:
        return {"error": str(err)}
    return {"error": None}


def test_the_example_refuses_ranks_of_a_row_holding_different_rows(tmp_path):
    for got in run_ranks(2, same_row_rank, tmp_path):
        assert got["error"] is not None and "the ranks of one row hold different rows" in got["error"]
