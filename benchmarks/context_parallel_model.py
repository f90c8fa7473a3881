"""A cost model of context parallelism: one training step of a packed row of S tokens split over W ranks.

    python -m benchmarks.context_parallel_model [--lengths 262144 524288 1048576] [--ranks 8 16 64]
                                                [--models llama-3.2-1b qwen2.5-vl-3b] [--layouts vlm video]
                                                [--fit RESULT.json ...] [--out DIR]

prints a table of every (model, layout, S, W) with each scheme's speedup and writes ``cost_model.json`` and
``cost_model.md`` to ``--out`` (default ``$OUT`` if set, else ``benchmarks/results/context_parallel/``). ``--fit``
first fits the hardware's constants to measured runs (`fit`: the JSON that ``examples/context_parallel.py --json``
writes, one per launch, each run of it a record) and predicts with them. `predict_step` is the reusable part:
per-rank times of one step for any row (``doc_ids`` / ``group_ids``), any shards (or a world size) and any scheme,
for a measured run to be set beside.

Schemes (every rank holds a contiguous shard of the row for the projections, MLPs and LM head):

- ``all_gather`` (`ContextParallel`'s ``all_gather`` schedule): shards balanced by work and cut between images
  (`balanced_bounds`); per layer each rank all-gathers K and V of the whole row in the forward and reduce-scatters
  dK / dV in the backward, one collective per tensor, not overlapped with anything.
- ``direct``, ``ring``, ``hybrid`` (`ContextParallel`'s schedules of those names, overlapped): each rank attends its
  queries to its own shard and to the key ranges of other shards that they see (`omni_hf.distributed.plan`: empty
  pairs skipped), brought by the schedule's transfers in rounds (direct: all from their owners in round 0; ring: one
  hop a round, relayed; hybrid: direct inside a node, a ring of the nodes that need a range across), simulated per
  rank as `omni_hf.distributed.exchange` runs them: a call starts once its keys are in, a round's transfers once the
  ranks they join finished the round before, each transfer at the rate of the busiest port on its path; the
  backward returns dK / dV in reverse while the earlier calls run.
- ``ulysses`` (modeled, not built): Ulysses inside a node (G = min(ranks per node, W) GPUs): an all-to-all of
  q / k / v over heads turns each GPU's token shard into 1/G of the heads over the node's shard (K / V heads
  replicated where Hkv < G), then the output's all-to-all back (the backward: dO in, dq / dk / dv out); across nodes
  a ring of whole node shards over each GPU's own NIC. Node shards are balanced by work and cut between images;
  inside a node tokens are split evenly.

What is modeled: matmul FLOPs of the projections, gated MLP and LM head at a GEMM rate (training = 3x forward, 4x
with activation recompute, which also runs each layer's attention forward and its exchange again); attention work
from the exact allowed (q, k) pairs of the layout at the measured attention rates (4 D Hq FLOPs per pair and layer
forward, 2.5x that backward); bytes over NVLink and the network at achieved bandwidths plus a latency per collective
or transfer; K / V memory. Not modeled: elementwise work (norms, rotary, activations, the loss, the paired
schedules' LSE merges), the optimizer and the gradient all-reduce of the parameters (the same for every scheme,
overlapped with the backward by DDP / FSDP), pipeline bubbles, overlap of communication with non-attention compute,
kernels' lower rate on small blocks, sliding windows. Each layer couples the ranks (collectives wait for the
slowest, transfers for their peers), so a step ends with its slowest rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from benchmarks.layouts import IMAGE_TOKENS, vlm_ids
from omni_hf.distributed.context_parallel import allowed_keys_per_query, balanced_bounds
from omni_hf.distributed.plan import RankPlan, Topology, Transfer, pair_spans, plan_transfers, rank_plan

PAIRED = ("direct", "ring", "hybrid")
BUILT = ("all_gather", *PAIRED)  # ContextParallel's schedules
SCHEMES = (*BUILT, "ulysses")
RESULTS = Path(__file__).resolve().parent / "results" / "context_parallel"
BF16_BYTES = 2
ATTENTION_BACKWARD_FACTOR = 2.5  # backward FLOPs over forward FLOPs of attention (the suite's convention)
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class ModelSizes:
    """A decoder's sizes (a VLM's language model): what its step costs per token and per allowed pair."""

    name: str
    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config, name: str | None = None) -> ModelSizes:
        """The sizes of a Transformers config (a VLM's text config is read through ``get_text_config``)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        q_heads = text.num_attention_heads
        return cls(name or getattr(text, "model_type", "model"), text.hidden_size, text.num_hidden_layers, q_heads,
                   getattr(text, "num_key_value_heads", None) or q_heads,
                   getattr(text, "head_dim", None) or text.hidden_size // q_heads, text.intermediate_size,
                   text.vocab_size)

    @property
    def token_flops(self) -> float:
        """Forward matmul FLOPs of one token over every layer and the LM head: q, k, v, o projections, the gated
        MLP (gate, up, down) and the head."""
        projections = 2 * self.hidden * (2 * self.q_heads + 2 * self.kv_heads) * self.head_dim
        return self.layers * (projections + 6 * self.hidden * self.intermediate) + 2 * self.hidden * self.vocab

    @property
    def pair_flops(self) -> float:
        """Forward attention FLOPs of one allowed (q, k) pair over every layer and query head (QK^T and PV)."""
        return 4 * self.head_dim * self.q_heads * self.layers

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token's keys and values in one layer (bf16)."""
        return 2 * self.kv_heads * self.head_dim * BF16_BYTES


LLAMA_3_2_1B = ModelSizes("llama-3.2-1b", hidden=2048, layers=16, q_heads=32, kv_heads=8, head_dim=64,
                          intermediate=8192, vocab=128256)
QWEN2_5_VL_3B = ModelSizes("qwen2.5-vl-3b", hidden=2048, layers=36, q_heads=16, kv_heads=2, head_dim=128,
                           intermediate=11008, vocab=151936)
MODELS = {sizes.name: sizes for sizes in (LLAMA_3_2_1B, QWEN2_5_VL_3B)}
# The longest row one H100 trains (activation checkpointing, chunked loss):
# benchmarks/results/vlm_training/max_length_qwen2.5-vl-3b_h100.json. Llama-3.2-1B's was not measured.
LONGEST_ROW_ONE_GPU = {"qwen2.5-vl-3b": 204_800}


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Achieved rates of one GPU and its links (defaults: H100 SXM nodes of 8 with NVSwitch, one 400 Gb/s NIC per GPU).

    Attributes:
        gemm_tflops: bf16 dense GEMM at a model's shapes (an H100 runs 761 at 8192^3, `benchmarks.bench_kernels`;
            a 1B-3B model's GEMMs, 2048 wide, run lower).
        attention_forward_tflops, attention_training_tflops: omni on VLM masks over the allowed pairs, forward and
            forward+backward (benchmarks/results/attention/realistic_h100.json: 530-568 / 416-425 at head dim 128,
            32k-token rows; the defaults take off about a quarter for head dim 64, small blocks and skew).
        nvlink_gb_s: NVLink per GPU and direction inside a node (900 GB/s bidirectional nominal).
        network_gb_s: the network per GPU across nodes (one 400 Gb/s InfiniBand NIC each).
        latency_s: fixed cost of one collective or one ring transfer.
        ranks_per_node: GPUs per node.
    """

    gemm_tflops: float = 600.0
    attention_forward_tflops: float = 400.0
    attention_training_tflops: float = 330.0
    nvlink_gb_s: float = 350.0
    network_gb_s: float = 45.0
    latency_s: float = 20e-6
    ranks_per_node: int = 8

    def token_s(self, sizes: ModelSizes, tokens) -> np.ndarray:
        """Training time (forward + backward) of ``tokens`` tokens' matmuls."""
        return 3 * sizes.token_flops * np.asarray(tokens, np.float64) / (self.gemm_tflops * 1e12)

    def attention_forward_s(self, sizes: ModelSizes, pairs) -> np.ndarray:
        """Forward attention time of ``pairs`` allowed pairs in one layer."""
        flops = sizes.pair_flops / sizes.layers * np.asarray(pairs, np.float64)
        return flops / (self.attention_forward_tflops * 1e12)

    def attention_backward_s(self, sizes: ModelSizes, pairs) -> np.ndarray:
        """Backward attention time of ``pairs`` allowed pairs in one layer."""
        flops = sizes.pair_flops / sizes.layers * np.asarray(pairs, np.float64)
        training = (1 + ATTENTION_BACKWARD_FACTOR) * flops / (self.attention_training_tflops * 1e12)
        return training - self.attention_forward_s(sizes, pairs)

    def token_cost_in_pairs(self, sizes: ModelSizes) -> float:
        """A token's matmul time in units of one allowed pair's attention time (training): `balanced_bounds`'
        ``token_cost`` that balances this model's whole step."""
        pair_s = (self.attention_forward_s(sizes, 1) + self.attention_backward_s(sizes, 1)) * sizes.layers
        return float(self.token_s(sizes, 1) / pair_s)


@dataclasses.dataclass(frozen=True)
class StepPrediction:
    """Per-rank times of one training step (float64 ``[W]`` seconds unless said).

    Attributes:
        scheme: one of `SCHEMES`.
        bounds: ``W + 1`` cut points; rank r holds tokens ``bounds[r]:bounds[r + 1]`` for its matmuls.
        attention_pairs: float64 ``[W]``, the allowed (q, k) pairs each rank's attention computes (over all heads:
            a rank that runs 1/G of the heads over N pairs counts N / G).
        compute_s: matmuls plus attention, forward and backward, every layer.
        attention_s: the attention part of ``compute_s``.
        comm_s: the time of the rank's transfers and collectives, hidden or not.
        wait_s: time in attention layers spent neither computing nor hidden: collectives not overlapped, transfers
            longer than the block they hide behind, waiting for a slower neighbour's shard.
        kv_bytes: int64 ``[W]``, keys and values held for attention at the rank's peak: those saved for the
            backward in every layer (no checkpointing) plus one layer's transient buffers.
        ring_steps: rounds of a paired schedule's transfers (0: nothing to send); for ``ulysses`` steps of its
            ring of node shards (0 without one).
    """

    scheme: str
    bounds: tuple[int, ...]
    attention_pairs: np.ndarray
    compute_s: np.ndarray
    attention_s: np.ndarray
    comm_s: np.ndarray
    wait_s: np.ndarray
    kv_bytes: np.ndarray
    ring_steps: int = 0

    @property
    def rank_s(self) -> np.ndarray:
        """float64 ``[W]``: each rank's step time."""
        return self.compute_s + self.wait_s

    @property
    def step_s(self) -> float:
        """The step's time: its slowest rank's."""
        return float(self.rank_s.max())

    @property
    def imbalance(self) -> float:
        """Compute imbalance: the slowest rank's compute over the mean, minus 1."""
        return float(self.compute_s.max() / self.compute_s.mean() - 1)

    @property
    def exposed_s(self) -> float:
        """What the step spends beyond its slowest rank's compute (communication that is not hidden)."""
        return float(self.step_s - self.compute_s.max())


def shard_pairs(doc_ids: np.ndarray, group_ids: np.ndarray, bounds) -> np.ndarray:
    """int64 ``[n, n]``: allowed (q, k) pairs of the token rule (no window) with the query in shard i and the key in
    shard j, shards ``bounds[i]:bounds[i + 1]``, summed over rows ``[B, S]`` (or one row ``[S]``).

    Below the diagonal a pair is allowed iff query and key share a document (the key comes first); above it iff they
    share a (document, group) pair; the diagonal is the rest of each query's allowed keys (`allowed_keys_per_query`).
    Any ids: documents and groups may recur after gaps. O(B S log S)."""
    doc_ids, group_ids = np.atleast_2d(doc_ids), np.atleast_2d(group_ids)
    shards = len(bounds) - 1
    shard_of = np.repeat(np.arange(shards), np.diff(bounds))
    rows = np.bincount(shard_of, weights=allowed_keys_per_query(doc_ids, group_ids).sum(0), minlength=shards)
    pairs = np.zeros((shards, shards), np.int64)
    for doc, grp in zip(doc_ids, group_ids):
        in_doc = doc >= 0
        in_group = in_doc & (grp >= 0)
        docs = _tokens_per_id_and_shard(doc[in_doc], shard_of[in_doc], shards)
        groups = _tokens_per_id_and_shard(doc[in_group].astype(np.int64) * (int(grp.max()) + 1) + grp[in_group],
                                          shard_of[in_group], shards)
        pairs += np.tril(docs.T @ docs, -1) + np.triu(groups.T @ groups, 1)
    pairs[np.diag_indices(shards)] = np.rint(rows).astype(np.int64) - pairs.sum(1)
    return pairs


def _tokens_per_id_and_shard(ids: np.ndarray, shard_of: np.ndarray, shards: int) -> np.ndarray:
    """int64 ``[distinct ids, shards]``: how many tokens of each id each shard holds."""
    _, index = np.unique(ids, return_inverse=True)
    counts = np.bincount(index.reshape(-1) * shards + shard_of, minlength=(index.max(initial=-1) + 1) * shards)
    return counts.reshape(-1, shards).astype(np.int64)


def ring_finish_s(block_s: np.ndarray, transfer_s: np.ndarray) -> np.ndarray:
    """float64 ``[n]``: when each rank of a ring finishes, from 0.

    Args:
        block_s: ``[n, steps]``, rank r's compute at step s (on the shard it holds then, ``r - s`` mod n).
        transfer_s: ``[n, steps]``, the time to pass the shard rank r holds at step s on to rank r + 1.
    Rank r starts step s + 1 when it has finished step s and the shard from rank r - 1 has arrived (sent when
    rank r - 1 started step s; double-buffered): alone, a step takes max(compute, transfer).
    """
    start = np.zeros(block_s.shape[0])
    for step in range(block_s.shape[1] - 1):
        arrival = np.roll(start + transfer_s[:, step], 1)
        start = np.maximum(start + block_s[:, step], arrival)
    return start + block_s[:, -1]


@dataclasses.dataclass
class RowLayout:
    """What a row at given cuts costs whatever the hardware: the shards' tokens, the allowed pairs of every (query
    shard, key shard), the key ranges a rank's queries see (`omni_hf.distributed.plan.pair_spans`), and the plans of
    the paired schedules (built once per topology).

    Attributes:
        rows: rows per step (B); bounds: the ``W + 1`` cuts; tokens: int64 ``[W]``, tokens per rank (over the rows).
        pairs: int64 ``[W, W]`` (`shard_pairs`); spans: int64 ``[W, W, 4]``; doc_ids, group_ids: ``[B, S]``.
    """

    rows: int
    bounds: tuple[int, ...]
    tokens: np.ndarray
    pairs: np.ndarray
    spans: np.ndarray
    doc_ids: np.ndarray
    group_ids: np.ndarray
    plans: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, doc_ids: np.ndarray, group_ids: np.ndarray, bounds) -> RowLayout:
        doc_ids, group_ids = np.atleast_2d(doc_ids), np.atleast_2d(group_ids)
        bounds = tuple(int(b) for b in bounds)
        rows = doc_ids.shape[0]
        return cls(rows, bounds, np.diff(bounds) * rows, shard_pairs(doc_ids, group_ids, bounds),
                   pair_spans(doc_ids, group_ids, bounds), doc_ids, group_ids)

    @property
    def world(self) -> int:
        return len(self.bounds) - 1

    def plan(self, schedule: str, ranks_per_node: int) -> tuple[tuple[Transfer, ...], list[RankPlan]]:
        """Every transfer and each rank's part of ``schedule`` over nodes of ``ranks_per_node`` consecutive ranks."""
        key = schedule, ranks_per_node
        if key not in self.plans:
            topology = Topology(tuple(r // ranks_per_node for r in range(self.world)))
            transfers = plan_transfers(self.spans, schedule, topology)
            self.plans[key] = transfers, [rank_plan(self.spans, transfers, r) for r in range(self.world)]
        return self.plans[key]


def predict_step(sizes: ModelSizes, doc_ids: np.ndarray, group_ids: np.ndarray, bounds_or_world, scheme: str,
                 hardware: Hardware = Hardware(), recompute: bool = False) -> StepPrediction:
    """Per-rank times of one training step of rows ``[B, S]`` (or one row ``[S]``) of token-rule ids.

    Args:
        sizes: the model (`ModelSizes`, or `ModelSizes.from_config`).
        doc_ids, group_ids: int ``[B, S]`` or ``[S]``, the rows' ids (the collator's ``omni_doc_ids`` /
            ``omni_group_ids``).
        bounds_or_world: the shards' ``W + 1`` cut points (e.g. ``ContextParallel.bounds`` of a measured run), or a
            world size W, for which shards are balanced by this model's work and cut between images
            (`balanced_bounds`; ``ulysses`` balances node shards so and splits each evenly over its GPUs).
        scheme: one of `SCHEMES` (module docstring).
        hardware: rates and links.
        recompute: activation checkpointing (each layer's forward runs again in the backward, its exchange too).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
    doc_ids, group_ids = np.atleast_2d(doc_ids), np.atleast_2d(group_ids)
    if scheme == "ulysses":
        world = bounds_or_world if isinstance(bounds_or_world, int) else len(bounds_or_world) - 1
        per_node = min(hardware.ranks_per_node, world)
        if world % per_node or sizes.q_heads % per_node:
            raise ValueError(f"ulysses: expected W ({world}) and the query heads ({sizes.q_heads}) divisible by the "
                             f"GPUs per node ({per_node})")
        bounds = _ulysses_bounds(sizes, doc_ids, group_ids, bounds_or_world, per_node, hardware)
        return _ulysses(sizes, doc_ids, group_ids, bounds, per_node, hardware, recompute)
    if isinstance(bounds_or_world, int):
        bounds = balanced_bounds(doc_ids, group_ids, bounds_or_world, token_cost=hardware.token_cost_in_pairs(sizes))
    else:
        bounds = bounds_or_world
    return predict(sizes, RowLayout.of(doc_ids, group_ids, bounds), scheme, hardware, recompute)


def best_schedule(sizes: ModelSizes, doc_ids: np.ndarray, group_ids: np.ndarray, bounds, ranks_per_node: int,
                  hardware: Hardware = Hardware(), recompute: bool = False) -> tuple[str, dict[str, float]]:
    """The built schedule (`BUILT`: what ``ContextParallel(schedule=...)`` takes) this model predicts fastest for rows
    ``[B, S]`` at ``bounds`` over nodes of ``ranks_per_node`` ranks, and each one's step time; ``all_gather`` only
    where no cut splits an image (it refuses such cuts)."""
    layout = RowLayout.of(doc_ids, group_ids, bounds)
    hardware = dataclasses.replace(hardware, ranks_per_node=ranks_per_node)
    splits = any(layout.spans[r, s, 1] > layout.spans[r, s, 0] for r in range(layout.world)
                 for s in range(r + 1, layout.world))
    steps = {scheme: predict(sizes, layout, scheme, hardware, recompute).step_s for scheme in BUILT
             if not (splits and scheme == "all_gather")}
    return min(steps, key=steps.get), steps


def predict(sizes: ModelSizes, layout: RowLayout, scheme: str, hardware: Hardware = Hardware(),
            recompute: bool = False) -> StepPrediction:
    """`predict_step` of a row's `RowLayout` (which a fit reuses for every hardware it tries); not ``ulysses``."""
    if scheme == "all_gather":
        return _all_gather(sizes, layout, hardware, recompute)
    if scheme in PAIRED:
        return _paired(sizes, layout, scheme, hardware, recompute)
    raise ValueError(f"scheme: expected one of {('all_gather', *PAIRED)} for a row layout, got {scheme!r}")


def _all_gather(sizes, layout: RowLayout, hardware: Hardware, recompute: bool) -> StepPrediction:
    """K and V all-gathered (padded to the longest shard) per layer once every rank has projected them, dK and dV
    reduce-scattered once every rank's attention backward is done; nothing overlaps."""
    tokens, world = layout.tokens, layout.world
    per_node = min(hardware.ranks_per_node, world)
    pairs_per_rank = layout.pairs.sum(1).astype(np.float64)
    forward_call = hardware.attention_forward_s(sizes, pairs_per_rank)
    backward_call = hardware.attention_backward_s(sizes, pairs_per_rank)
    chunk = tokens.max() * sizes.kv_bytes_per_token / 2  # one rank's K (or V) of one layer
    nodes = math.ceil(world / per_node)
    # NVLink brings the W - 1 other shards; across nodes each GPU's NIC brings its rail's N - 1 (NCCL's rings run
    # one channel per NIC and pipeline both).
    collective = 0.0 if world == 1 else hardware.latency_s + chunk * max(
        (world - 1) / (hardware.nvlink_gb_s * 1e9), (nodes - 1) / (hardware.network_gb_s * 1e9))
    pre, post = _layer_matmul_s(sizes, hardware, tokens)
    forward = (pre.max() + 2 * collective + forward_call + post).max()  # K, V
    backward = (2 * post + backward_call).max() + 2 * collective + (2 * pre).max()  # dK, dV
    comm = np.full(world, (2 + recompute) * 2 * sizes.layers * collective)
    stops = np.cumsum(tokens)
    kv = sizes.kv_bytes_per_token * (sizes.layers * stops + (world * tokens.max() if world > 1 else 0))
    return _synchronous("all_gather", sizes, layout, hardware, recompute, forward_call, backward_call,
                        (1 + recompute) * forward + backward, comm, kv, pairs_per_rank)


def _layer_matmul_s(sizes: ModelSizes, hardware: Hardware, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``[W]`` each: one layer's forward matmuls per rank before attention (q, k, v projections) and after
    it (the output projection and the gated MLP); the backward takes twice each."""
    pre = 2 * sizes.hidden * (sizes.q_heads + 2 * sizes.kv_heads) * sizes.head_dim
    post = 2 * sizes.q_heads * sizes.head_dim * sizes.hidden + 6 * sizes.hidden * sizes.intermediate
    rate = hardware.gemm_tflops * 1e12
    return tokens * pre / rate, tokens * post / rate


def _synchronous(scheme, sizes, layout, hardware, recompute, forward_call, backward_call, layer_s, comm, kv, pairs,
                 ring_steps: int = 0) -> StepPrediction:
    """A prediction whose ranks move through the layers together (each layer's exchange couples them): a step is
    ``layers`` of ``layer_s`` plus the slowest rank's LM head; every rank's time is the step's."""
    layer_compute = (1 + recompute) * forward_call + backward_call
    attention = sizes.layers * layer_compute
    head = 3 * 2 * sizes.hidden * sizes.vocab * layout.tokens / (hardware.gemm_tflops * 1e12)
    compute = _token_s(hardware, sizes, layout.tokens, recompute) + attention
    step = sizes.layers * layer_s + head.max()
    return StepPrediction(scheme, layout.bounds, pairs, compute, attention, comm, step - compute,
                          np.asarray(kv).astype(np.int64), ring_steps)


def _token_s(hardware: Hardware, sizes: ModelSizes, tokens, recompute: bool) -> np.ndarray:
    """The matmuls' time: forward and backward (3 forwards' FLOPs), one forward more of the layers with recompute."""
    head = 2 * sizes.hidden * sizes.vocab * np.asarray(tokens, np.float64) / (hardware.gemm_tflops * 1e12)
    return hardware.token_s(sizes, tokens) + recompute * (hardware.token_s(sizes, tokens) / 3 - head)


def _paired(sizes, layout: RowLayout, scheme: str, hardware: Hardware, recompute: bool) -> StepPrediction:
    """A paired schedule as `omni_hf.distributed.exchange` runs it, one layer simulated per rank (every layer the
    same, the ranks together). Forward: once a rank has projected its keys, round 0 starts and it runs its own
    shard's call, then each round's calls once that round's keys are in (a round's transfers start when the ranks
    they join have finished the round before: relays wait for their data, not for compute), then the output
    projection and MLP. Backward: the MLP's and output projection's, then the calls of the last round's keys; each
    round's dK / dV go back, from the last round, once its calls and the returns from further on are done, while the
    calls of the round before run; then the projections'."""
    world = layout.world
    transfers, plans = layout.plan(scheme, min(hardware.ranks_per_node, world))
    rounds = plans[0].rounds
    group_pairs = np.zeros((world, rounds + 1))  # [:, 0]: the own shard's call; [:, k + 1]: round k's
    for plan in plans:
        for pair in plan.pairs:
            group_pairs[plan.rank, pair.round + 1] += layout.pairs[plan.rank, pair.chunk]
    forward_calls = hardware.attention_forward_s(sizes, group_pairs)
    backward_calls = hardware.attention_backward_s(sizes, group_pairs)
    durations, peers = _round_durations(transfers, world, rounds, layout.rows * sizes.kv_bytes_per_token, hardware)
    pre, post = _layer_matmul_s(sizes, hardware, layout.tokens)
    forward = (_forward_rounds(forward_calls, durations, peers, pre) + post).max()
    backward = (_backward_rounds(backward_calls, durations, peers, 2 * post) + 2 * pre).max()
    comm = sizes.layers * (2 + recompute) * durations.sum(1)
    received = np.array([sum(t.stop - t.start for t in plan.receives) for plan in plans]) * layout.rows
    held = layout.tokens + received
    kv = sizes.kv_bytes_per_token * (sizes.layers * held + 2 * held)  # saved per layer; float32 dK / dV of one
    return _synchronous(scheme, sizes, layout, hardware, recompute, forward_calls.sum(1), backward_calls.sum(1),
                        (1 + recompute) * forward + backward, comm, kv, group_pairs.sum(1), rounds)


def _round_durations(transfers, world: int, rounds: int, token_bytes: float, hardware: Hardware
                     ) -> tuple[np.ndarray, list[list[set]]]:
    """float64 ``[W, rounds]``: how long each rank's transfers of each round take (the latency, then the busiest of
    its own ports and its peers' on each kind of link: NVLink inside a node, the network across, each direction at
    its rate), and each rank's peers per round. The backward's returns move the same bytes the other way: the same
    durations."""
    node = np.arange(world) // hardware.ranks_per_node
    port = np.zeros((rounds, 2, 2, world))  # round, (NVLink, network), (out, in), rank: bytes
    peers = [[set() for _ in range(rounds)] for _ in range(world)]
    for t in transfers:
        size, link = (t.stop - t.start) * token_bytes, int(node[t.src] != node[t.dst])
        port[t.round, link, 0, t.src] += size
        port[t.round, link, 1, t.dst] += size
        peers[t.src][t.round].add(t.dst)
        peers[t.dst][t.round].add(t.src)
    rate = np.array([hardware.nvlink_gb_s, hardware.network_gb_s])[:, None] * 1e9
    durations = np.zeros((world, rounds))
    for r in range(world):
        for k in range(rounds):
            if peers[r][k]:
                busiest = np.stack([port[k, :, :, p].max(1) for p in (r, *peers[r][k])]).max(0)  # per link
                durations[r, k] = hardware.latency_s + (busiest[:, None] / rate).max()
    return durations, peers


def _forward_rounds(calls: np.ndarray, durations: np.ndarray, peers, ready: np.ndarray) -> np.ndarray:
    """float64 ``[W]``: when each rank's attention forward of a layer ends (``calls``: ``[W, rounds + 1]`` seconds;
    ``ready``: when each rank's keys are projected)."""
    world, rounds = durations.shape
    issue = ready.astype(np.float64)
    compute = issue + calls[:, 0]
    for k in range(rounds):
        done = _round_done(issue, durations[:, k], [p[k] for p in peers])
        compute = np.maximum(compute, done) + calls[:, k + 1]
        issue = done
    return compute


def _backward_rounds(calls: np.ndarray, durations: np.ndarray, peers, ready: np.ndarray) -> np.ndarray:
    """float64 ``[W]``: when each rank's attention backward of a layer ends (from ``ready``, when its output's
    gradient is): the calls of the last round's keys, then for each round from the last its returns (issued after
    its calls and the later round's returns), overlapped with the calls of the round before."""
    world, rounds = durations.shape
    compute = ready + calls[:, rounds]
    for k in reversed(range(rounds)):
        done = _round_done(compute, durations[:, k], [p[k] for p in peers])
        compute = np.maximum(compute + calls[:, k], done)
    return compute


def _round_done(issue: np.ndarray, durations: np.ndarray, peers: list[set]) -> np.ndarray:
    """When each rank's transfers of a round end: they start once the rank and its peers have issued them."""
    start = np.array([max([issue[r], *(issue[p] for p in peers[r])]) for r in range(len(issue))])
    return np.where([bool(p) for p in peers], start + durations, issue)


def _shard_ring(sizes, pairs, tokens, bounds, hardware, recompute: bool) -> StepPrediction:
    """Whole K / V shards around a ring, overlapped with each block's attention, stopping after the last needed step
    (`ulysses`'s ring of node shards)."""
    world = len(tokens)
    ranks = np.arange(world)
    back = (ranks[:, None] - ranks[None, :]) % world  # step at which rank i holds shard j
    steps = int(back[pairs > 0].max(initial=0)) + 1
    held = (ranks[:, None] - np.arange(steps)[None, :]) % world  # [W, steps]: shard rank r holds at step s
    block = pairs[ranks[:, None], held].astype(np.float64)
    same_node = ranks // hardware.ranks_per_node == np.roll(ranks, -1) // hardware.ranks_per_node
    bandwidth = np.where(same_node, hardware.nvlink_gb_s, hardware.network_gb_s)[:, None] * 1e9
    kv_transfer = hardware.latency_s + tokens[held] * sizes.kv_bytes_per_token / bandwidth
    forward = ring_finish_s(hardware.attention_forward_s(sizes, block), kv_transfer)
    backward_transfer = 2 * kv_transfer - hardware.latency_s  # K, V and the dK, dV accumulators
    returned = kv_transfer[:, -1] if steps > 1 else np.zeros(world)  # dK, dV back to their owner
    backward = ring_finish_s(hardware.attention_backward_s(sizes, block), backward_transfer) + returned
    pairs_per_rank = block.sum(1)
    attention_layer = (hardware.attention_forward_s(sizes, pairs_per_rank)
                       + hardware.attention_backward_s(sizes, pairs_per_rank))
    attention_layer = attention_layer + recompute * hardware.attention_forward_s(sizes, pairs_per_rank)
    attention = sizes.layers * attention_layer
    comm = sizes.layers * ((1 + recompute) * kv_transfer[:, :-1].sum(1) + backward_transfer[:, :-1].sum(1) + returned)
    wait = sizes.layers * ((1 + recompute) * forward + backward - attention_layer)
    kv = sizes.kv_bytes_per_token * (sizes.layers * tokens + (4 * tokens.max() if steps > 1 else 0))
    return StepPrediction("ulysses", bounds, pairs_per_rank, _token_s(hardware, sizes, tokens, recompute) + attention,
                          attention, comm, wait, kv.astype(np.int64), steps)


def _ulysses_bounds(sizes, doc_ids, group_ids, bounds_or_world, per_node, hardware) -> list[int]:
    """The ranks' cut points: given, or node shards balanced by work (cut between images), each split evenly."""
    if not isinstance(bounds_or_world, int):
        return [int(b) for b in bounds_or_world]
    nodes = bounds_or_world // per_node
    node_bounds = balanced_bounds(doc_ids, group_ids, nodes, token_cost=hardware.token_cost_in_pairs(sizes))
    return [int(start + (stop - start) * gpu // per_node) for start, stop in zip(node_bounds, node_bounds[1:])
            for gpu in range(per_node)] + [node_bounds[-1]]


def _ulysses(sizes, doc_ids, group_ids, bounds, per_node, hardware, recompute: bool) -> StepPrediction:
    """Ulysses over heads inside each node, a rail-aligned ring of node shards across nodes."""
    world, rows = len(bounds) - 1, doc_ids.shape[0]
    tokens = np.diff(bounds) * rows
    node_bounds = list(bounds[::per_node])
    node_pairs = shard_pairs(doc_ids, group_ids, node_bounds)
    node_tokens = np.diff(node_bounds) * rows
    kv_heads = max(sizes.kv_heads, per_node)  # replicated where fewer than the GPUs
    # each GPU keeps 1/G of its tokens' heads and sends the rest: forward q, k, v then the output; backward the
    # output's gradient then dq, dk, dv (the same bytes); four all-to-alls per layer, two more with recompute
    heads = 2 * sizes.q_heads + 2 * kv_heads
    moved = tokens * heads * sizes.head_dim * BF16_BYTES * (per_node - 1) / per_node
    all_to_all = ((2 * moved / (hardware.nvlink_gb_s * 1e9) + 4 * hardware.latency_s) * (1 + recompute / 2)
                  if per_node > 1 else np.zeros(world))
    per_gpu_sizes = dataclasses.replace(sizes, q_heads=sizes.q_heads // per_node, kv_heads=kv_heads // per_node)
    ring = _shard_ring(per_gpu_sizes, node_pairs, node_tokens, tuple(node_bounds),
                       dataclasses.replace(hardware, ranks_per_node=1), recompute)  # across nodes: the network
    node_of = np.arange(world) // per_node
    attention = ring.attention_s[node_of]
    kv = ring.kv_bytes[node_of]
    comm = ring.comm_s[node_of] + sizes.layers * all_to_all
    wait = ring.wait_s[node_of] + sizes.layers * all_to_all
    return StepPrediction("ulysses", tuple(bounds), node_pairs.sum(1)[node_of] / per_node,
                          _token_s(hardware, sizes, tokens, recompute) + attention, attention, comm, wait, kv,
                          ring.ring_steps if len(node_tokens) > 1 else 0)


# ---------------------------------------------------------------------- the evaluation on packed VLM rows


def long_video_ids(seq_len: int, seed: int = 0, frame_tokens: int = IMAGE_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """doc / group ids int32 ``[S]`` of one packed row of video-like samples: documents of 32k-128k tokens, each a
    prompt of 64-512 text tokens, then frames of ``frame_tokens`` (one group id each) between timestamps of 8-32
    text tokens (the last document and frame cut at the row's end)."""
    rng = np.random.default_rng(seed)
    doc = np.empty(seq_len, np.int32)
    grp = np.full(seq_len, -1, np.int32)
    pos, d, g = 0, 0, 0
    while pos < seq_len:
        end = min(pos + int(rng.integers(32768, 131073)), seq_len)
        doc[pos:end] = d
        frame = pos + int(rng.integers(64, 513))
        while frame < end:
            grp[frame:min(frame + frame_tokens, end)] = g
            frame, g = frame + frame_tokens + int(rng.integers(8, 33)), g + 1
        pos, d = end, d + 1
    return doc, grp


LAYOUTS = {"vlm": vlm_ids, "video": long_video_ids}
LAYOUT_NOTES = {"vlm": "benchmarks.layouts.vlm_ids: documents of 2k-6k tokens, text runs of 16-256 between "
                       "576-token images",
                "video": "long_video_ids: documents of 32k-128k tokens, 576-token frames between 8-32-token "
                         "timestamps"}


def evaluate(models: list[ModelSizes], layouts: list[str], lengths: list[int], ranks: list[int],
             hardware: Hardware = Hardware(), seed: int = 0) -> list[dict]:
    """One record per (model, layout, S) on one GPU (``ranks`` 1) and per (model, layout, S, W, scheme)."""
    records = []
    for sizes in models:
        for layout in layouts:
            for length in lengths:
                doc, grp = (ids[None] for ids in LAYOUTS[layout](length, seed))
                one = predict_step(sizes, doc, grp, 1, "all_gather", hardware)
                longest = LONGEST_ROW_ONE_GPU.get(sizes.name)
                base = {"model": sizes.name, "layout": layout, "seq_len": length,
                        "one_gpu_holds": None if longest is None else length <= longest}
                records.append({**base, "ranks": 1, "scheme": "one_gpu", **_summary(one, length, one.step_s),
                                "attention_share": float(one.attention_s[0] / one.compute_s[0])})
                for world in ranks:
                    bounds = balanced_bounds(doc, grp, world, token_cost=hardware.token_cost_in_pairs(sizes))
                    row = RowLayout.of(doc, grp, bounds)
                    for scheme in SCHEMES:
                        prediction = (predict_step(sizes, doc, grp, world, scheme, hardware) if scheme == "ulysses"
                                      else predict(sizes, row, scheme, hardware))
                        records.append({**base, "ranks": world, "nodes": math.ceil(world / hardware.ranks_per_node),
                                        "scheme": scheme, **_summary(prediction, length, one.step_s)})
    return records


# ---------------------------------------------------------------------- fitting the constants to measured runs


FIT_PARAMETERS = ("compute", "nvlink_gb_s", "network_gb_s", "latency_s")
_COMPUTE_RATES = ("gemm_tflops", "attention_forward_tflops", "attention_training_tflops")


@dataclasses.dataclass
class MeasuredRun:
    """One timed run of ``examples/context_parallel.py`` as the model predicts it (`measured_runs`).

    Attributes:
        sizes: the model; row: its first timed row at the run's cuts; scheme: its schedule (``all_gather`` for one
        GPU); ranks_per_node: the run's (emulated) nodes' ranks; link_gb_s: the emulated link, or None;
        data_ranks: rows trained at once; recompute: activation checkpointing; tokens_per_s: measured.
    """

    sizes: ModelSizes
    row: RowLayout
    scheme: str
    ranks_per_node: int
    link_gb_s: float | None
    data_ranks: int
    recompute: bool
    tokens_per_s: float

    def predicted_tokens_per_s(self, hardware: Hardware) -> float:
        hardware = dataclasses.replace(hardware, ranks_per_node=self.ranks_per_node,
                                       network_gb_s=self.link_gb_s or hardware.network_gb_s)
        step = predict(self.sizes, self.row, self.scheme, hardware, self.recompute).step_s
        return self.data_ranks * self.row.tokens.sum() / step


def ids_from_runs(runs: list[list[list[int]]]) -> np.ndarray:
    """int32 ``[B, S]`` ids from per-row runs ``[id, length]`` (``examples/context_parallel.py``'s ``id_runs``)."""
    return np.stack([np.repeat([v for v, _ in row], [n for _, n in row]) for row in runs]).astype(np.int32)


def measured_runs(results: list[dict]) -> list[MeasuredRun]:
    """Every run of ``examples/context_parallel.py --json`` results (one per launch; a launch's ``runs``, each with
    its schedule, nodes, link, cuts, first row and tokens/s)."""
    runs = []
    for result in results:
        sizes = ModelSizes(result["model"], **result["sizes"])
        ranks = result.get("gpus") or result["ranks"]
        for run in result.get("runs") or [result]:
            doc, grp = (ids_from_runs(run["row"][key]) for key in ("doc_runs", "group_runs"))
            world = len(run["bounds"]) - 1
            runs.append(MeasuredRun(sizes, RowLayout.of(doc, grp, run["bounds"]),
                                    "all_gather" if world == 1 else run["schedule"], world // run["nodes"],
                                    run.get("link_gb_s"), ranks // world, result.get("checkpointing", False),
                                    run["tokens_per_s"]))
    return runs


def fit(runs: list[MeasuredRun], hardware: Hardware = Hardware(), parameters=FIT_PARAMETERS) -> tuple[Hardware, float]:
    """The hardware whose predictions of ``runs``' tokens/s are closest to the measured (least squares of the log
    ratios), from ``hardware``, over ``parameters`` (``compute`` scales the GEMM and attention rates together; the
    others are `Hardware` fields): a scan of each parameter's factors 1/64-64 (a parameter that no run depends on
    keeps its value), then Nelder-Mead over the logs of those that matter. Returns it and the root-mean-square log
    ratio."""
    unknown = set(parameters) - {"compute", *(f.name for f in dataclasses.fields(Hardware))}
    if unknown:
        raise ValueError(f"parameters: expected 'compute' or Hardware fields, got {sorted(unknown)}")

    def error(candidate: Hardware) -> float:
        ratios = [math.log(run.predicted_tokens_per_s(candidate) / run.tokens_per_s) for run in runs]
        return float(np.sqrt(np.mean(np.square(ratios))))

    grid, moved = np.linspace(-6, 6, 49), []
    for name in parameters:
        errors = np.array([error(_scaled(hardware, {name: x})) for x in grid])
        if errors.max() - errors.min() > 1e-9:
            moved.append(name)
            hardware = _scaled(hardware, {name: float(grid[errors.argmin()])})
    if moved:
        best = _nelder_mead(lambda x: error(_scaled(hardware, dict(zip(moved, x)))), np.zeros(len(moved)))
        hardware = _scaled(hardware, dict(zip(moved, best)))
    return hardware, error(hardware)


def _scaled(hardware: Hardware, log2_factors: dict[str, float]) -> Hardware:
    """``hardware`` with each named parameter times 2 ** its factor (``compute``: the three compute rates)."""
    changes = {}
    for name, log_factor in log2_factors.items():
        for field in _COMPUTE_RATES if name == "compute" else (name,):
            changes[field] = float(getattr(hardware, field) * 2.0 ** log_factor)
    return dataclasses.replace(hardware, **changes)


def _nelder_mead(function, start: np.ndarray, step: float = 0.25, iterations: int = 600,
                 tolerance: float = 1e-12) -> np.ndarray:
    """A minimum of ``function`` near ``start`` (the downhill simplex: reflect, expand, contract, shrink)."""
    simplex = np.vstack([start, start + step * np.eye(len(start))])
    values = np.array([function(x) for x in simplex])
    for _ in range(iterations):
        order = np.argsort(values)
        simplex, values = simplex[order], values[order]
        if values[-1] - values[0] < tolerance:
            break
        centroid = simplex[:-1].mean(0)
        reflected = centroid + (centroid - simplex[-1])
        value = function(reflected)
        if value < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            expanded_value = function(expanded)
            simplex[-1], values[-1] = (expanded, expanded_value) if expanded_value < value else (reflected, value)
        elif value < values[-2]:
            simplex[-1], values[-1] = reflected, value
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            contracted_value = function(contracted)
            if contracted_value < values[-1]:
                simplex[-1], values[-1] = contracted, contracted_value
            else:
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                values[1:] = [function(x) for x in simplex[1:]]
    return simplex[np.argmin(values)]


def _summary(prediction: StepPrediction, length: int, one_gpu_s: float) -> dict:
    """A prediction's figures for the JSON (times in seconds, memory in GiB)."""
    comm = float(prediction.comm_s.max())
    return {"step_s": prediction.step_s, "tokens_per_s": length / prediction.step_s,
            "speedup": one_gpu_s / prediction.step_s, "imbalance": prediction.imbalance, "comm_s": comm,
            "exposed_s": prediction.exposed_s,
            "comm_hidden": None if comm == 0 else float(np.clip(1 - prediction.exposed_s / comm, 0, 1)),
            "kv_gib": float(prediction.kv_bytes.max() / GIB), "ring_steps": prediction.ring_steps,
            "tokens_per_rank": [int(min(np.diff(prediction.bounds))), int(max(np.diff(prediction.bounds)))]}


def markdown_table(records: list[dict]) -> str:
    """Per (model, layout, S, W): each scheme's speedup over one GPU, time not hidden, K/V GiB; the best of the built
    schedules."""
    lines = ["| model | layout | S | W | attention on 1 GPU | " + " | ".join(SCHEMES) + " | best built |",
             "|---|---|---|---|---|" + "---|" * (len(SCHEMES) + 1)]
    one_gpu = {(r["model"], r["layout"], r["seq_len"]): r for r in records if r["scheme"] == "one_gpu"}
    cases = {}
    for record in records:
        if record["scheme"] != "one_gpu":
            cases.setdefault((record["model"], record["layout"], record["seq_len"], record["ranks"]), {})[
                record["scheme"]] = record
    for (model, layout, length, world), schemes in cases.items():
        one = one_gpu[model, layout, length]
        cells = [f"{schemes[s]['speedup']:.2f}x ({schemes[s]['exposed_s'] * 1e3:.0f} ms, {schemes[s]['kv_gib']:.1f} "
                 f"GiB)" for s in SCHEMES]
        best = max(BUILT, key=lambda name: schemes[name]["speedup"])
        holds = {True: "", False: " *", None: " ?"}[one["one_gpu_holds"]]
        lines.append(f"| {model} | {layout} | {length // 1024}k{holds} | {world} | "
                     f"{one['attention_share']:.0%} of {one['step_s']:.2f} s | {' | '.join(cells)} | {best} |")
    return "\n".join(lines)


TABLE_LEGEND = ("Each scheme: speedup over one GPU's modeled step (tokens/s at W over tokens/s on one GPU at the same "
                "S), in parentheses the step's time beyond its slowest rank's compute (communication not hidden) and "
                "the K/V memory of the fullest rank. `*`: one H100 cannot hold this row (Qwen2.5-VL-3B's longest is "
                "204,800 tokens), so the speedup compares per-token throughput with a GPU that could; `?`: not "
                "measured.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[262144, 524288, 1048576])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fit", type=Path, nargs="+", default=None,
                        help="examples/context_parallel.py --json results: fit the hardware's constants to their runs "
                             "first, and predict with the fitted ones")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: $OUT or benchmarks/results/context_parallel)")
    args = parser.parse_args(argv)
    hardware, fitted = Hardware(), None
    if args.fit:
        runs = measured_runs([json.loads(path.read_text()) for path in args.fit])
        hardware, rms = fit(runs)
        fitted = {"files": [str(path) for path in args.fit], "rms_log_ratio": rms, "runs": [
            {"scheme": run.scheme, "ranks": run.row.world, "ranks_per_node": run.ranks_per_node,
             "link_gb_s": run.link_gb_s, "measured_tokens_per_s": run.tokens_per_s,
             "predicted_tokens_per_s": run.predicted_tokens_per_s(hardware)} for run in runs]}
        print(f"fitted to {len(runs)} runs (rms log ratio {rms:.3f}): {dataclasses.asdict(hardware)}")
    records = evaluate([MODELS[name] for name in args.models], args.layouts, args.lengths, args.ranks, hardware,
                       args.seed)
    command = "python -m benchmarks.context_parallel_model " + " ".join(sys.argv[1:] if argv is None else argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": command.strip(), "hardware": dataclasses.asdict(hardware), "fit": fitted,
            "models": [dataclasses.asdict(MODELS[name]) for name in args.models],
            "layouts": {name: LAYOUT_NOTES[name] for name in args.layouts}, "seed": args.seed}
    (out / "cost_model.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    table = markdown_table(records)
    (out / "cost_model.md").write_text(f"# Context parallelism past two GPUs: the cost model's predictions\n\n"
                                       f"`{command.strip()}` (`benchmarks/context_parallel_model.py`; hardware: "
                                       f"{dataclasses.asdict(hardware)}).\n\n{TABLE_LEGEND}\n\n{table}\n")
    print(table)
    print(f"wrote {out / 'cost_model.json'} and {out / 'cost_model.md'}")


if __name__ == "__main__":
    main()
