"""What a context-parallel attention layer computes and moves, planned on the host from the rows' ids and the cuts.

Rank r holds the queries and keys of shard ``bounds[r]:bounds[r + 1]``. Its queries need keys of another shard s only
where the token rule allows a pair: keys before (s < r) of the same document, within the window or of the same group;
keys after (s > r) of the same (document, group), an image that a cut splits. `pair_spans` finds, for every (query
shard, key shard) pair, the range of queries that see any of the key shard's keys and the range of those keys; empty
pairs are not computed and their keys are not sent. A schedule routes each key range from its owner to the ranks that
need it (`plan_transfers`), in rounds: a rank forwards in round k + 1 what it received in round k.

- ``direct``: every range straight from its owner, all in round 0 (one node: NVLink between every pair).
- ``ring``: ranges travel r -> r + 1 -> ..., each rank taking its part and forwarding what ranks further on need.
- ``hybrid``: straight to the ranks of the owner's node; across nodes as a ring of the nodes that need the range,
  in ring order, each hop into one rank of the next such node (the owner's rail rank, the same local index and its
  own NIC, where that rank needs the range, else one of those that do, by the owner's local index, so that the
  ranges of a node's ranks spread over the NICs of the next), which hands the node's other ranks
  their part and the next node its range: each range crosses into a node once, and every relay uses what it
  forwards (a rank that only relayed would hold the returns of dK / dV behind its own compute).

The forward runs this plan (`omni_hf.distributed.exchange`); the backward runs it in reverse with dK / dV.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch.distributed as dist

__all__ = ["SCHEDULES", "Pair", "RankPlan", "Topology", "Transfer", "choose_schedule", "pair_spans", "plan_transfers",
           "rank_plan"]

SCHEDULES = ("all_gather", "direct", "ring", "hybrid")
NVLINK_TO_INFINIBAND = 45.0  # GB/s per GPU and direction of a 400 Gb/s NIC (InfiniBand NDR), ~1/8 of NVLink 4's


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where the ranks of a context-parallel group are.

    Attributes:
        node_of: the node of each rank of the group (any ints; ranks of one node share one).
        link_gb_s: an emulated link between nodes (`Topology.emulated`), in GB/s per rank and direction; None: the
            real links. Transfers between nodes then take at least bytes / link_gb_s (on one host: NVLink stands in
            for both, and each cross-node transfer is held back to that rate).
    """

    node_of: tuple[int, ...]
    link_gb_s: float | None = None

    def __post_init__(self):
        if self.link_gb_s is not None and not 0 < self.link_gb_s < float("inf"):
            raise ValueError(f"link_gb_s: expected a positive finite bandwidth in GB/s or None, got {self.link_gb_s}")

    @classmethod
    def of_group(cls, group: Any = None) -> Topology:
        """The real nodes of ``group``'s ranks: global rank // ``LOCAL_WORLD_SIZE`` (torchrun's ranks per node;
        without it, one node)."""
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
        return cls(tuple(int(rank) // per_node for rank in ranks))

    @classmethod
    def emulated(cls, world_size: int, nodes: int, link_gb_s: float = NVLINK_TO_INFINIBAND) -> Topology:
        """``world_size`` ranks of one host as ``nodes`` nodes of consecutive ranks whose links between nodes run at
        ``link_gb_s`` (default 45 GB/s: InfiniBand NDR, one 400 Gb/s NIC per GPU, about 1/8 of NVLink 4)."""
        if nodes < 1 or world_size % nodes:
            raise ValueError(f"nodes: expected a divisor of the {world_size} ranks, got {nodes}")
        return cls(tuple(rank * nodes // world_size for rank in range(world_size)), link_gb_s if nodes > 1 else None)

    @property
    def nodes(self) -> int:
        return len(set(self.node_of))


def choose_schedule(topology: Topology, gatherable: bool = False) -> str:
    """The schedule ``"auto"`` runs. Inside one node ``all_gather`` where the cuts split no image (``gatherable``:
    on four H100s over NVLink it ran 5% faster than ``direct``, whose per-pair calls cost more than its overlap hides
    there; benchmarks/results/context_parallel/README.md), else ``direct``; across nodes ``hybrid`` (each key range
    crosses into a node once, mostly on its owner's rail), or ``ring`` where nodes hold different numbers of ranks (no
    rails). benchmarks/context_parallel_model.py models each on a row and a topology."""
    if topology.nodes == 1:
        return "all_gather" if gatherable else "direct"
    sizes = np.unique(np.unique(topology.node_of, return_counts=True)[1])
    return "hybrid" if len(sizes) == 1 else "ring"


# ---------------------------------------------------------------------- which pairs, which ranges


def pair_spans(doc_ids: np.ndarray, group_ids: np.ndarray, bounds, window: int | None = None) -> np.ndarray:
    """int64 ``[W, W, 4]``: for query shard r and key shard s, ``(q_start, q_stop, k_start, k_stop)``, the positions
    of the queries of r that see some key of s and of the keys of s that some query of r sees, each range from the
    first to the last of them, over the rows ``[B, S]`` (or one row ``[S]``); all 0 where no pair is allowed. The
    diagonal is each shard with a real token (doc >= 0) against itself.

    Exact where documents are runs of positions (as the collator packs them) and wherever there is no window; with a
    window and a document that recurs after a gap, a range may hold more than those positions (never fewer) and is
    still empty exactly where no pair is allowed. O(B S log S)."""
    doc_ids, group_ids = np.atleast_2d(doc_ids), np.atleast_2d(group_ids)
    bounds = np.asarray(bounds, np.int64)
    shards = len(bounds) - 1
    shard_of = np.repeat(np.arange(shards), np.diff(bounds))
    big = np.iinfo(np.int64).max
    first = np.full((2, shards, shards), big)  # queries, keys: least position
    last = np.full((2, shards, shards), -1)  # greatest position
    for doc, grp in zip(doc_ids.astype(np.int64), group_ids.astype(np.int64)):
        real = np.flatnonzero(doc >= 0)
        _update(first, last, *_id_pairs(doc[real], real, shard_of[real], shards), window, before_only=True)
        member = real[grp[real] >= 0]
        combined = doc[member] * (int(grp.max()) + 1) + grp[member]
        _update(first, last, *_id_pairs(combined, member, shard_of[member], shards), None, before_only=False)
    spans = np.zeros((shards, shards, 4), np.int64)
    present = last[1] >= 0
    spans[present] = np.stack([first[0], last[0] + 1, first[1], last[1] + 1], -1)[present]
    real_shard = np.bincount(shard_of, weights=(doc_ids >= 0).sum(0), minlength=shards) > 0
    for r in np.flatnonzero(real_shard):
        spans[r, r] = bounds[r], bounds[r + 1], bounds[r], bounds[r + 1]
    return spans


def _id_pairs(ids: np.ndarray, positions: np.ndarray, shard_of: np.ndarray, shards: int) -> tuple[np.ndarray, ...]:
    """For every id and every two shards r != s that both hold it: r, s, and the id's first and last position in r
    and in s (int64 arrays, one entry per such (id, r, s))."""
    if len(ids) == 0:
        return (np.zeros(0, np.int64),) * 6
    key = np.unique(ids, return_inverse=True)[1].reshape(-1) * shards + shard_of
    order = np.lexsort((positions, key))
    key, sorted_positions = key[order], positions[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], len(key)] - 1
    entry_id, entry_shard = key[starts] // shards, key[starts] % shards
    entry_first, entry_last = sorted_positions[starts], sorted_positions[ends]
    id_start = np.flatnonzero(np.r_[True, entry_id[1:] != entry_id[:-1]])
    count = np.diff(np.r_[id_start, len(entry_id)])
    per_entry_start, per_entry_count = np.repeat(id_start, count), np.repeat(count, count)
    left = np.repeat(np.arange(len(entry_id)), per_entry_count)
    offsets = np.arange(len(left)) - np.repeat(np.cumsum(per_entry_count) - per_entry_count, per_entry_count)
    right = per_entry_start[left] + offsets
    keep = entry_shard[left] != entry_shard[right]
    left, right = left[keep], right[keep]
    return (entry_shard[left], entry_shard[right], entry_first[left], entry_last[left], entry_first[right],
            entry_last[right])


def _update(first, last, r, s, q_first, q_last, k_first, k_last, window, before_only: bool) -> None:
    """Widen the ranges of pairs (r, s) by one relation's queries and keys: a document's (keys before the queries,
    within ``window`` of the nearest query) or a group's (either side, no window)."""
    if before_only:
        keep = s < r
        r, s, q_first, q_last, k_first, k_last = (x[keep] for x in (r, s, q_first, q_last, k_first, k_last))
        if window is not None:
            k_first = np.maximum(k_first, q_first - window + 1)  # the first query reaches furthest back
            q_last = np.minimum(q_last, k_last + window - 1)  # the last key reaches furthest forward
            keep = (k_first <= k_last) & (q_first <= q_last)
            r, s, q_first, q_last, k_first, k_last = (x[keep] for x in (r, s, q_first, q_last, k_first, k_last))
    for side, (lo, hi) in enumerate(((q_first, q_last), (k_first, k_last))):
        np.minimum.at(first[side], (r, s), lo)
        np.maximum.at(last[side], (r, s), hi)


# ---------------------------------------------------------------------- routes


@dataclasses.dataclass(frozen=True, order=True)
class Transfer:
    """Keys ``start:stop`` (positions of the row) of shard ``chunk``, sent by rank ``src`` to rank ``dst`` in round
    ``round`` (with their values; dK / dV go back the same way in the backward)."""

    round: int
    src: int
    dst: int
    chunk: int
    start: int
    stop: int


def plan_transfers(spans: np.ndarray, schedule: str, topology: Topology) -> tuple[Transfer, ...]:
    """Every transfer of a layer's forward (module docstring), sorted by round, source, destination and chunk. Each
    rank receives a chunk at most once: the range it needs joined with what it forwards of it.

    Args:
        spans: `pair_spans` of the rows.
        schedule: ``"direct"``, ``"ring"`` or ``"hybrid"`` (nodes of equal size).
        topology: the ranks' nodes (for the hybrid's rails).
    """
    shards = spans.shape[0]
    if schedule not in SCHEDULES[1:]:
        raise ValueError(f"schedule: expected one of {SCHEDULES[1:]} to plan transfers for, got {schedule!r}")
    if len(topology.node_of) != shards:
        raise ValueError(f"topology: expected the nodes of {shards} ranks, got {len(topology.node_of)}")
    transfers = []
    for chunk in range(shards):
        need = {r: (int(spans[r, chunk, 2]), int(spans[r, chunk, 3])) for r in range(shards)
                if r != chunk and spans[r, chunk, 3] > spans[r, chunk, 2]}
        if need:
            transfers += _tree_transfers(chunk, need, _parents(schedule, chunk, sorted(need), topology))
    return tuple(sorted(transfers))


def _parents(schedule: str, chunk: int, needers: list[int], topology: Topology) -> dict[int, int]:
    """The rank each rank of the chunk's route receives it from (the needers and the ranks that relay to them)."""
    shards = len(topology.node_of)
    if schedule == "direct":
        return {r: chunk for r in needers}
    if schedule == "ring":
        farthest = max((r - chunk) % shards for r in needers)
        return {(chunk + d) % shards: (chunk + d - 1) % shards for d in range(1, farthest + 1)}
    nodes = sorted(set(topology.node_of))
    members = [[r for r in range(shards) if topology.node_of[r] == node] for node in nodes]
    if len({len(m) for m in members}) != 1:
        raise ValueError(f"topology: the hybrid schedule needs nodes of equal size (rails), got nodes of "
                         f"{[len(m) for m in members]} ranks")
    node_index = {r: i for i, m in enumerate(members) for r in m}
    home, local = node_index[chunk], members[node_index[chunk]].index(chunk)
    parents, previous = {}, chunk
    for hop in range(len(nodes)):  # the owner's node, then the others in ring order
        here = [r for r in needers if node_index[r] == (home + hop) % len(nodes)]
        if not here:
            continue
        rail = members[(home + hop) % len(nodes)][local]
        entry = chunk if hop == 0 else rail if rail in here else here[local % len(here)]  # NICs of several
        if hop:
            parents[entry] = previous
        parents.update({r: entry for r in here if r != entry})
        previous = entry
    return parents


def _tree_transfers(chunk: int, need: dict[int, tuple[int, int]], parents: dict[int, int]) -> list[Transfer]:
    """The transfers of one chunk's route tree: each rank receives the hull of its own range and its subtree's, in
    the round of its depth (the chunk's owner at depth 0)."""
    depth = {chunk: 0}

    def depth_of(rank: int) -> int:
        if rank not in depth:
            depth[rank] = depth_of(parents[rank]) + 1
        return depth[rank]

    none = (np.iinfo(np.int64).max, -1)
    held = {}  # rank -> the hull of its own range and of its subtree's
    for rank in sorted(parents, key=depth_of, reverse=True):  # children before parents
        ranges = (need.get(rank, none), held.get(rank, none))
        held[rank] = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
        if parents[rank] != chunk:
            ranges = (held.get(parents[rank], none), held[rank])
            held[parents[rank]] = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
    return [Transfer(depth_of(rank) - 1, parents[rank], rank, chunk, *held[rank]) for rank in parents]


# ---------------------------------------------------------------------- one rank's part


@dataclasses.dataclass(frozen=True)
class Pair:
    """One attention call of a rank: its queries ``queries`` (positions of the row) over the keys ``keys`` of shard
    ``chunk``, which arrive in round ``round`` (-1: the rank's own)."""

    queries: tuple[int, int]
    keys: tuple[int, int]
    chunk: int
    round: int


@dataclasses.dataclass(frozen=True)
class RankPlan:
    """One rank's part of a layer's plan.

    Attributes:
        rank: the rank; rounds: the plan's rounds (every rank steps through them all).
        pairs: the calls to run, in the order their keys arrive (the own shard first).
        receives, sends: the rank's transfers (`Transfer`), by round.
        skipped: (query shard, key shard) pairs of this rank not computed, as no pair of them is allowed.
    """

    rank: int
    rounds: int
    pairs: tuple[Pair, ...]
    receives: tuple[Transfer, ...]
    sends: tuple[Transfer, ...]
    skipped: int


def rank_plan(spans: np.ndarray, transfers: tuple[Transfer, ...], rank: int) -> RankPlan:
    """``rank``'s part of the plan of `pair_spans` and `plan_transfers`."""
    arrival = {t.chunk: t.round for t in transfers if t.dst == rank}
    pairs = [Pair((int(q0), int(q1)), (int(k0), int(k1)), chunk, -1 if chunk == rank else arrival[chunk])
             for chunk, (q0, q1, k0, k1) in enumerate(spans[rank]) if q1 > q0]
    pairs.sort(key=lambda pair: (pair.round, pair.chunk))
    rounds = 1 + max((t.round for t in transfers), default=-1)
    return RankPlan(rank, rounds, tuple(pairs), tuple(t for t in transfers if t.dst == rank),
                    tuple(t for t in transfers if t.src == rank), spans.shape[0] - len(pairs))
