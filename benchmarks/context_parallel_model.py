"""A cost model of context parallelism: one training step of a packed row of S tokens split over W ranks.

    python -m benchmarks.context_parallel_model [--lengths 262144 524288 1048576] [--ranks 8 16 64]
                                                [--models llama-3.2-1b qwen2.5-vl-3b] [--layouts vlm video] [--out DIR]

prints a table of every (model, layout, S, W) with each scheme's speedup and writes ``cost_model.json`` and
``cost_model.md`` to ``--out`` (default ``$OUT`` if set, else ``benchmarks/results/context_parallel/``).
`predict_step` is the reusable part: per-rank times of one step for any row (``doc_ids`` / ``group_ids``), any
shards (or a world size) and any of the three schemes, for a measured run to be set beside.

Schemes (every rank holds a contiguous shard of the row for the projections, MLPs and LM head):

- ``all_gather`` (what `omni_hf.distributed.ContextParallel` does): shards balanced by work and cut between images
  (`balanced_bounds`); per layer each rank all-gathers K and V of the whole row in the forward and reduce-scatters
  dK / dV in the backward, one collective per tensor. The collectives are not overlapped with anything (as built).
- ``ring``: the same shards; per layer K / V shards pass to the next rank while each rank attends its queries to the
  shard it holds (time of a step = max(the block's compute, the transfer), simulated per rank with the wait for the
  neighbour's shard); the backward passes K, V and the dK / dV accumulators (twice the bytes) and returns dK / dV to
  their owner in one last transfer. The ring stops after the last step that any rank's block needs (known on the
  host from the ids: with shards cut between images, the steps back to the first shard of the longest document). A
  ring over contiguous shards needs what the kernels lack today: a query offset (queries that are not the last
  ``q_len`` positions of the keys) and, where a cut falls inside an image, a mask per (query shard, key shard) pair.
- ``hybrid``: Ulysses inside a node (G = min(ranks per node, W) GPUs): an all-to-all of q / k / v over heads turns
  each GPU's token shard into 1/G of the heads over the node's shard (K / V heads replicated where Hkv < G), then
  the output's all-to-all back (the backward: dO in, dq / dk / dv out); across nodes a ring of the node shards over
  each GPU's own NIC (rail-aligned, K / V of its heads only). At W <= G this is pure Ulysses. Node shards are balanced
  by work and cut between images; inside a node tokens are split evenly (attention sees the whole node shard).

What is modeled: matmul FLOPs of the projections, gated MLP and LM head at a GEMM rate (training = 3x forward);
attention work from the exact allowed (q, k) pairs of the layout at the measured attention rates (4 D Hq FLOPs per
pair and layer forward, 2.5x that backward); bytes over NVLink and the network at achieved bandwidths plus a
latency per collective or transfer; K / V memory. Not modeled: activation recompute (checkpointing), elementwise
work (norms, rotary, activations, the loss), the optimizer and the gradient all-reduce of the parameters (the same
for every scheme, overlapped with the backward by DDP / FSDP), pipeline bubbles, overlap of communication with
non-attention compute, contention of several collectives on one link, kernels' lower rate on small blocks, sliding
windows. Each layer's collectives make the ranks wait for the slowest, so a step ends with its slowest rank.
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

SCHEMES = ("all_gather", "ring", "hybrid")
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
        ring_steps: steps of the ring (across nodes for the hybrid); 0 without a ring.
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


def predict_step(sizes: ModelSizes, doc_ids: np.ndarray, group_ids: np.ndarray, bounds_or_world, scheme: str,
                 hardware: Hardware = Hardware()) -> StepPrediction:
    """Per-rank times of one training step of rows ``[B, S]`` (or one row ``[S]``) of token-rule ids.

    Args:
        sizes: the model (`ModelSizes`, or `ModelSizes.from_config`).
        doc_ids, group_ids: int ``[B, S]`` or ``[S]``, the rows' ids (the collator's ``omni_doc_ids`` /
            ``omni_group_ids``).
        bounds_or_world: the shards' ``W + 1`` cut points (e.g. ``ContextParallel.bounds`` of a measured run), or a
            world size W, for which shards are balanced by this model's work and cut between images
            (`balanced_bounds`; the hybrid balances node shards so and splits each evenly over its GPUs).
        scheme: ``"all_gather"``, ``"ring"`` or ``"hybrid"`` (module docstring).
        hardware: rates and links.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme: expected one of {SCHEMES}, got {scheme!r}")
    doc_ids, group_ids = np.atleast_2d(doc_ids), np.atleast_2d(group_ids)
    world = bounds_or_world if isinstance(bounds_or_world, int) else len(bounds_or_world) - 1
    per_node = min(hardware.ranks_per_node, world)
    if scheme == "hybrid":
        if world % per_node or sizes.q_heads % per_node:
            raise ValueError(f"hybrid: expected W ({world}) and the query heads ({sizes.q_heads}) divisible by the "
                             f"GPUs per node ({per_node})")
        bounds = _hybrid_bounds(sizes, doc_ids, group_ids, bounds_or_world, per_node, hardware)
        return _hybrid(sizes, doc_ids, group_ids, bounds, per_node, hardware)
    if isinstance(bounds_or_world, int):
        bounds = balanced_bounds(doc_ids, group_ids, world, token_cost=hardware.token_cost_in_pairs(sizes))
    else:
        bounds = [int(b) for b in bounds_or_world]
    pairs = shard_pairs(doc_ids, group_ids, bounds)
    rows = doc_ids.shape[0]
    if scheme == "all_gather":
        return _all_gather(sizes, pairs, np.diff(bounds) * rows, tuple(bounds), per_node, hardware)
    return _ring(sizes, pairs, np.diff(bounds) * rows, tuple(bounds), hardware)


def _all_gather(sizes, pairs, tokens, bounds, per_node, hardware) -> StepPrediction:
    """K and V all-gathered (padded to the longest shard) per layer, dK and dV reduce-scattered; nothing overlaps."""
    world = len(tokens)
    pairs_per_rank = pairs.sum(1).astype(np.float64)
    attention = sizes.layers * (hardware.attention_forward_s(sizes, pairs_per_rank)
                                + hardware.attention_backward_s(sizes, pairs_per_rank))
    chunk = tokens.max() * sizes.kv_bytes_per_token / 2  # one rank's K (or V) of one layer
    nodes = math.ceil(world / per_node)
    # NVLink brings the W - 1 other shards; across nodes each GPU's NIC brings its rail's N - 1 (NCCL's rings run
    # one channel per NIC and pipeline both).
    collective = hardware.latency_s + chunk * max((world - 1) / (hardware.nvlink_gb_s * 1e9),
                                                  (nodes - 1) / (hardware.network_gb_s * 1e9))
    comm = np.full(world, 4 * sizes.layers * collective if world > 1 else 0.0)  # K, V forward; dK, dV backward
    stops = np.cumsum(tokens)
    kv = sizes.kv_bytes_per_token * (sizes.layers * stops + (world * tokens.max() if world > 1 else 0))
    return StepPrediction("all_gather", bounds, pairs_per_rank, hardware.token_s(sizes, tokens) + attention,
                          attention, comm, comm, kv.astype(np.int64))


def _ring(sizes, pairs, tokens, bounds, hardware) -> StepPrediction:
    """K / V shards around the ring, overlapped with each block's attention, stopping after the last needed step."""
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
    attention = sizes.layers * attention_layer
    comm = sizes.layers * (kv_transfer[:, :-1].sum(1) + backward_transfer[:, :-1].sum(1) + returned)
    wait = sizes.layers * (forward + backward - attention_layer)
    kv = sizes.kv_bytes_per_token * (sizes.layers * tokens + (4 * tokens.max() if steps > 1 else 0))
    return StepPrediction("ring", bounds, pairs_per_rank, hardware.token_s(sizes, tokens) + attention, attention,
                          comm, wait, kv.astype(np.int64), steps)


def _hybrid_bounds(sizes, doc_ids, group_ids, bounds_or_world, per_node, hardware) -> list[int]:
    """The ranks' cut points: given, or node shards balanced by work (cut between images), each split evenly."""
    if not isinstance(bounds_or_world, int):
        return [int(b) for b in bounds_or_world]
    nodes = bounds_or_world // per_node
    node_bounds = balanced_bounds(doc_ids, group_ids, nodes, token_cost=hardware.token_cost_in_pairs(sizes))
    return [int(start + (stop - start) * gpu // per_node) for start, stop in zip(node_bounds, node_bounds[1:])
            for gpu in range(per_node)] + [node_bounds[-1]]


def _hybrid(sizes, doc_ids, group_ids, bounds, per_node, hardware) -> StepPrediction:
    """Ulysses over heads inside each node, a rail-aligned ring of node shards across nodes."""
    world, rows = len(bounds) - 1, doc_ids.shape[0]
    tokens = np.diff(bounds) * rows
    node_bounds = list(bounds[::per_node])
    node_pairs = shard_pairs(doc_ids, group_ids, node_bounds)
    node_tokens = np.diff(node_bounds) * rows
    kv_heads = max(sizes.kv_heads, per_node)  # replicated where fewer than the GPUs
    # each GPU keeps 1/G of its tokens' heads and sends the rest: forward q, k, v then the output; backward the
    # output's gradient then dq, dk, dv (the same bytes); four all-to-alls per layer
    heads = 2 * sizes.q_heads + 2 * kv_heads
    moved = tokens * heads * sizes.head_dim * BF16_BYTES * (per_node - 1) / per_node
    all_to_all = (2 * moved / (hardware.nvlink_gb_s * 1e9) + 4 * hardware.latency_s if per_node > 1
                  else np.zeros(world))
    per_gpu_sizes = dataclasses.replace(sizes, q_heads=sizes.q_heads // per_node, kv_heads=kv_heads // per_node)
    ring = _ring(per_gpu_sizes, node_pairs, node_tokens, tuple(node_bounds),
                 dataclasses.replace(hardware, ranks_per_node=1))  # across nodes every hop is on the network
    node_of = np.arange(world) // per_node
    attention = ring.attention_s[node_of]
    kv = ring.kv_bytes[node_of]
    comm = ring.comm_s[node_of] + sizes.layers * all_to_all
    wait = ring.wait_s[node_of] + sizes.layers * all_to_all
    return StepPrediction("hybrid", tuple(bounds), node_pairs.sum(1)[node_of] / per_node,
                          hardware.token_s(sizes, tokens) + attention, attention, comm, wait, kv,
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
                    for scheme in SCHEMES:
                        shards = world if scheme == "hybrid" else bounds
                        prediction = predict_step(sizes, doc, grp, shards, scheme, hardware)
                        records.append({**base, "ranks": world, "nodes": math.ceil(world / hardware.ranks_per_node),
                                        "scheme": scheme, **_summary(prediction, length, one.step_s)})
    return records


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
    """Per (model, layout, S, W): each scheme's speedup over one GPU, time not hidden, K/V GiB; the winner."""
    lines = ["| model | layout | S | W | attention on 1 GPU | all-gather | ring | hybrid | best |",
             "|---|---|---|---|---|---|---|---|---|"]
    one_gpu = {(r["model"], r["layout"], r["seq_len"]): r for r in records if r["scheme"] == "one_gpu"}
    cases = {}
    for record in records:
        if record["scheme"] != "one_gpu":
            cases.setdefault((record["model"], record["layout"], record["seq_len"], record["ranks"]), {})[
                record["scheme"]] = record
    for (model, layout, length, world), schemes in cases.items():
        one = one_gpu[model, layout, length]
        cells = [f"{r['speedup']:.2f}x ({r['exposed_s'] * 1e3:.0f} ms, {r['kv_gib']:.1f} GiB)"
                 for r in schemes.values()]
        best = max(schemes, key=lambda name: schemes[name]["speedup"])
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
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: $OUT or benchmarks/results/context_parallel)")
    args = parser.parse_args(argv)
    hardware = Hardware()
    records = evaluate([MODELS[name] for name in args.models], args.layouts, args.lengths, args.ranks, hardware,
                       args.seed)
    command = "python -m benchmarks.context_parallel_model " + " ".join(sys.argv[1:] if argv is None else argv)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": command.strip(), "hardware": dataclasses.asdict(hardware),
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
