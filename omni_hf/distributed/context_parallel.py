"""Context parallelism: one packed row split across the ranks of a process group, attention exact over the whole row.

Each rank holds a contiguous shard of the row's tokens (queries, and the keys / values they produce). In each
attention layer a rank attends its queries to its own keys and to the key ranges of other shards that they see,
which the schedule brings while it computes (`omni_hf.distributed.plan`, `omni_hf.distributed.exchange`): each
(query shard, key shard) pair with an allowed pair is one call with its own typed-block mask
(`OmniBlockMask.from_token_id_ranges`), empty pairs are skipped, and the calls' outputs merge by their LSE; the
backward returns dK / dV the same way. So cuts may split an image. ``direct`` (one node), ``ring`` and ``hybrid``
(across nodes) route the ranges; ``auto`` picks by the topology and the cuts (`choose_schedule`). The ``all_gather``
schedule, the first design, is kept (in one node, where it can run, ``auto`` takes it): it all-gathers K and V of
the whole row per layer (not overlapped; the backward reduce-scatters dK / dV) and attends the shard's queries to
the keys before its end, which is exact where no image straddles a cut.

`balanced_bounds` cuts rows between groups and balances the shards by work: each query's allowed keys (a VLM row's
later tokens see far more keys than its first) plus a cost per token for the projections, MLPs and LM head
(`token_work_in_pairs`).

With an engine (DDP, FSDP2) the batches are built ahead, in DataLoader workers, and each rank takes its shard there:

    collate = ContextParallelCollator(OmniCollator(...), world_size=cp_size, rank=cp_rank,
                                      token_cost=token_work_in_pairs(config))
    for batch in DataLoader(rows, batch_size=None, collate_fn=collate, ...):   # same rows on a row's cp ranks
        cp = batch.pop("omni_context_parallel").to(device, group=cp_group)
        loss = model(**{k: v.to(device) for k, v in batch.items()}, omni_context_parallel=cp).loss
        loss.backward()                                                       # the engine averages the gradients

``shard_batch`` hands the model the shard's tokens and positions, labels shifted across shard boundaries
(``shift_labels``) and ``num_items_in_batch`` = the whole row's count of labelled tokens over the number of ranks, so
the ranks' losses *average* to the row's loss, as DDP and FSDP average gradients (over a data x context mesh, the
mean of the rows' losses). docs/performance/context_parallel.md weighs the schedules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..mask import OmniBlockMask
from ..ops import omni_attention
from .exchange import Links, paired_attention, pause
from .plan import SCHEDULES, RankPlan, Topology, Transfer, choose_schedule, pair_spans, plan_transfers, rank_plan

__all__ = ["SCHEDULES", "ContextParallel", "ContextParallelCollator", "Topology", "allowed_keys_per_query",
           "balanced_bounds", "token_work_in_pairs"]


def allowed_keys_per_query(doc_ids: np.ndarray, group_ids: np.ndarray, window: int | None = None) -> np.ndarray:
    """int64 ``[B, S]``: how many keys each query row of the token rule sees (its share of the attention work).

    A query sees the keys of its document (same id, wherever it is) up to itself and within ``window``, and every
    key of its group (same document and group id) outside that; a padding query (doc -1) sees none. O(B S log S).
    """
    return np.stack([_allowed_keys(doc, grp, window) for doc, grp in zip(doc_ids, group_ids)]).astype(np.int64)


def token_work_in_pairs(config) -> float:
    """The work of one token outside attention (its projections, MLP and LM head), in units of one allowed (q, k)
    pair's attention work, both summed over the layers: the ``token_cost`` that balances a model's whole step.

    Counts matmul FLOPs of a Transformers decoder config (a VLM's text config): per layer ``2 h (Hq + 2 Hkv) D +
    2 Hq D h`` for q, k, v, o and ``6 h i`` for the gated MLP of Llama, Qwen, Mistral, Gemma and Phi-3, plus
    ``2 h vocab`` once for the LM head; a pair costs ``4 Hq D`` per layer (QK^T and PV). The backward scales both
    alike, and attention kernels run somewhat below GEMM speed, so this is a model of the balance, not a timing.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "intermediate_size", None) is None:
        raise ValueError(f"config: expected a dense decoder config with intermediate_size (Llama, Qwen, Mistral, "
                         f"Gemma, Phi-3), got {type(text).__name__} without one; pass token_cost yourself")
    hidden, layers = text.hidden_size, text.num_hidden_layers
    q_heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or q_heads
    head_dim = getattr(text, "head_dim", None) or hidden // q_heads
    projections = 2 * hidden * (q_heads + 2 * kv_heads) * head_dim + 2 * q_heads * head_dim * hidden
    mlp = 6 * hidden * text.intermediate_size
    per_token = layers * (projections + mlp) + 2 * hidden * text.vocab_size
    return per_token / (layers * 4 * q_heads * head_dim)


def _allowed_keys(doc: np.ndarray, grp: np.ndarray, window: int | None) -> np.ndarray:
    """`allowed_keys_per_query` of one row."""
    length = len(doc)
    position = np.arange(length)
    near = np.zeros_like(position) if window is None else np.maximum(position - window + 1, 0)  # first key in window
    pair, member = _group_keys(doc, grp)
    causal = _same_id_between(doc, near, position)
    group = (_same_id_between(pair, position + 1, np.full_like(position, length - 1))
             + _same_id_between(pair, np.zeros_like(position), near - 1))
    return np.where(doc >= 0, causal + np.where(member, group, 0), 0)


def _same_id_between(ids: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """int64 ``[S]``: for each position i, the positions j in ``lo[i]..hi[i]`` with ``ids[j] == ids[i]`` (0 where
    the range is empty)."""
    length = len(ids)
    base = (ids.astype(np.int64) - ids.min()) * (length + 1)  # one id's keys: base + position, sorted
    ordered = np.sort(base + np.arange(length))
    counts = np.searchsorted(ordered, base + hi, side="right") - np.searchsorted(ordered, base + lo, side="left")
    return np.where(hi >= lo, counts, 0)


def _group_keys(doc: np.ndarray, grp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position of one row: the index of its (document, group) pair, and whether it is in a group at all."""
    member = (doc >= 0) & (grp >= 0)
    _, inverse = np.unique(np.stack([doc, grp], axis=1), axis=0, return_inverse=True)
    return inverse.reshape(-1), member


def _check_token_cost(token_cost: float) -> None:
    if not token_cost >= 0 or not np.isfinite(token_cost):
        raise ValueError(f"token_cost: expected a finite cost >= 0 in (q, k) pairs per token, got {token_cost}")


def _uncuttable(doc: np.ndarray, grp: np.ndarray) -> np.ndarray:
    """bool ``[S + 1]``: True at each cut point that would leave one (document, group) pair on both sides."""
    pair, member = _group_keys(doc, grp)
    positions = np.arange(len(pair))
    first = np.full(pair.max() + 1, len(pair))
    last = np.full(pair.max() + 1, -1)
    np.minimum.at(first, pair[member], positions[member])
    np.maximum.at(last, pair[member], positions[member])
    spans = last > first
    inside = np.zeros(len(pair) + 2, dtype=np.int64)  # cuts first + 1 .. last split the pair
    np.add.at(inside, first[spans] + 1, 1)
    np.add.at(inside, last[spans] + 1, -1)
    return np.cumsum(inside)[:len(pair) + 1] > 0


def balanced_bounds(doc_ids: np.ndarray, group_ids: np.ndarray, world_size: int, window: int | None = None,
                    token_cost: float = 0.0) -> list[int]:
    """Cut points ``[0, c_1, ..., S]`` splitting rows ``[B, S]`` into ``world_size`` shards of about equal work, each
    cut moved to the nearest position that splits no group of any row (so the shards' attention is exact, see the
    module docstring). A position's work is its queries' allowed keys (`allowed_keys_per_query`, summed over the
    batch) plus ``token_cost`` per row (the work every token costs outside attention, in (q, k) pairs:
    `token_work_in_pairs`; 0 balances attention alone). Raises ValueError where that leaves a shard empty."""
    _check_token_cost(token_cost)
    work = allowed_keys_per_query(doc_ids, group_ids, window).sum(0) + token_cost * doc_ids.shape[0]
    length = work.shape[0]
    cumulative = np.concatenate([[0], np.cumsum(work)])
    blocked = np.stack([_uncuttable(doc, grp) for doc, grp in zip(doc_ids, group_ids)]).any(0)
    candidates = np.flatnonzero(~blocked)
    cuts = [0]
    for rank in range(1, world_size):
        target = np.searchsorted(cumulative, cumulative[-1] * rank / world_size)
        nearest = candidates[np.argmin(np.abs(candidates - target))]
        cuts.append(int(max(nearest, cuts[-1])))
    cuts.append(length)
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise ValueError(f"doc_ids: rows of {length} tokens leave an empty shard among {world_size} (cuts {cuts}; cuts "
                         "never split an image group): use fewer ranks or longer rows")
    return cuts


_KEEP = object()  # `ContextParallel.to`'s default: keep the shard's group
# torch's one-tensor collectives under their current names; torch releases without them know only the older names,
# which newer releases deprecate (a FutureWarning per call).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _AllGather(torch.autograd.Function):
    """``[W * B, ...]``: ``x`` (``[B, ...]``) of every rank of ``group``, joined along dim 0. The backward sums the
    ranks' gradients of each piece on its owner: a reduce-scatter on GPUs; on the CPU an all-reduce that keeps the
    rank's piece (gloo's reduce-scatter is recent). torch's own differentiable all-gather emulates the backward on gloo
    with scatters that take group ranks for global ones, which fails on the context subgroup of a 2D mesh. ``delay_s``:
    what an emulated link between nodes adds to each collective (`pause`)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, delay_s: float) -> torch.Tensor:
        ctx.group, ctx.delay_s = group, delay_s
        gathered = x.new_empty((dist.get_world_size(group) * x.shape[0], *x.shape[1:]))
        _all_gather_single(gathered, x.contiguous(), group=group)
        pause(delay_s, x.device)
        return gathered

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        world = dist.get_world_size(ctx.group)
        if grad.device.type == "cpu":
            summed = grad.clone(memory_format=torch.contiguous_format)
            dist.all_reduce(summed, group=ctx.group)
            mine = summed.chunk(world)[dist.get_rank(ctx.group)]
        else:
            mine = grad.new_empty((grad.shape[0] // world, *grad.shape[1:]))
            _reduce_scatter_single(mine, grad.contiguous(), group=ctx.group)
        pause(ctx.delay_s, grad.device)
        return mine, None, None


@dataclasses.dataclass(frozen=True, eq=False)
class ContextParallel:
    """This rank's shard of packed rows that a process group shares, as every omni attention layer reads it.

    Attributes:
        doc_ids, group_ids: int32 ``[B, S]``, the whole rows' token-rule ids (on the model's device).
        bounds: ``world_size + 1`` cut points; rank r holds tokens ``bounds[r]:bounds[r + 1]``.
        rank: this process's rank in ``group``.
        group: the process group of the row's ranks (None: the default group). A shard made in a DataLoader
            worker (`ContextParallelCollator`) has none yet: `to` sets it in the training process.
        schedule: how attention brings the keys (`SCHEDULES`; ``dataclasses.replace(cp, schedule=...)`` forces one):
            ``"auto"`` (default) picks by the topology (`choose_schedule`: ``direct`` in one node, else
            ``hybrid``); ``"all_gather"``: the whole row's K and V gathered per layer, not overlapped (needs cuts
            between images, as `balanced_bounds` makes); ``"direct"``, ``"ring"``, ``"hybrid"``: only the key ranges
            that a rank's queries see, sent while it attends (module docstring of `omni_hf.distributed.plan`).
        topology: the nodes of the group's ranks (None: from torchrun's ``LOCAL_WORLD_SIZE``), or an emulated
            slow link between nodes of one host (`Topology.emulated`).
        cache: what is built once per batch and serves every layer: the plans (on the host, kept by `to`) and the
            masks (per sliding window and device).
    """

    doc_ids: torch.Tensor
    group_ids: torch.Tensor
    bounds: tuple[int, ...]
    rank: int
    group: Any = None
    schedule: str = "auto"
    topology: Topology | None = None
    cache: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not 0 <= self.rank < len(self.bounds) - 1:
            raise ValueError(f"rank: expected 0 <= rank < {len(self.bounds) - 1} (the shards of bounds {self.bounds}), "
                             f"got {self.rank}")
        if self.schedule not in ("auto", *SCHEDULES):
            raise ValueError(f"schedule: expected 'auto' or one of {SCHEDULES}, got {self.schedule!r}")
        if self.topology is not None and len(self.topology.node_of) != self.world_size:
            raise ValueError(f"topology: expected the nodes of the {self.world_size} ranks, got "
                             f"{len(self.topology.node_of)}")

    @classmethod
    def for_batch(cls, doc_ids: torch.Tensor, group_ids: torch.Tensor, group: Any = None,
                  window: int | None = None, token_cost: float = 0.0, schedule: str = "auto") -> ContextParallel:
        """Split a collator batch's rows (``omni_doc_ids`` / ``omni_group_ids``, the same on every rank of
        ``group``) over ``group``, balanced by `balanced_bounds` (``window``: the sliding window of the model's
        layers, if all have one; ``token_cost``: see there). Reads the ids on the host: in a training loop, build
        the shards ahead with `ContextParallelCollator` instead."""
        if not dist.is_initialized():
            raise RuntimeError("ContextParallel: expected an initialised torch.distributed process group, got none "
                               "(launch with torchrun or accelerate launch)")
        bounds = balanced_bounds(doc_ids.cpu().numpy(), group_ids.cpu().numpy(), dist.get_world_size(group), window,
                                 token_cost)
        return cls(doc_ids.to(torch.int32), group_ids.to(torch.int32), tuple(bounds), dist.get_rank(group), group,
                   schedule)

    def to(self, device: torch.device | str, group: Any = _KEEP, non_blocking: bool = False) -> ContextParallel:
        """This shard with its ids on ``device`` and, where given, ``group`` as its process group (None: the default
        group). The group must have this shard's number of ranks, and this process this shard's rank in it. Without
        ``group`` the shard keeps its own, unchecked: a loader's device placement (accelerate's ``send_to_device``
        calls ``.to(device)`` on whatever has one) moves a collator's shard before it is bound. The host's plans stay
        in the cache, the masks go."""
        check = group is not _KEEP
        group = self.group if group is _KEEP else group
        if check and dist.is_initialized() and (dist.get_world_size(group), dist.get_rank(group)) != (
                self.world_size, self.rank):
            raise ValueError(f"group: expected the row's {self.world_size} ranks "
                             f"with this process as rank {self.rank}, "
                             f"got {dist.get_world_size(group)} ranks with this process as rank "
                             f"{dist.get_rank(group)} (pass the context-parallel group, e.g. mesh['cp'].get_group())")
        doc, grp = (ids.to(device, non_blocking=non_blocking) for ids in (self.doc_ids, self.group_ids))
        plans = {key: value for key, value in self.cache.items() if key[0] in ("spans", "plan")}
        return dataclasses.replace(self, doc_ids=doc, group_ids=grp, group=group, cache=plans)

    @property
    def world_size(self) -> int:
        return len(self.bounds) - 1

    @property
    def start(self) -> int:
        return self.bounds[self.rank]

    @property
    def stop(self) -> int:
        return self.bounds[self.rank + 1]

    def shard(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's tokens of a ``[..., S, ...]`` tensor (the token dim is ``dim``)."""
        return tensor.narrow(dim, self.start, self.stop - self.start)

    def shard_batch(self, batch: dict[str, Any], label_ignore_index: int = -100) -> dict[str, Any]:
        """The model inputs of this rank from a collator batch (per-token ``[B, S]`` tensors): input_ids,
        position_ids and attention_mask sharded, labels shifted over the whole row first (so a shard's last token
        predicts the next shard's first) and passed as ``shift_labels``, ``num_items_in_batch`` = the rows' count of
        labelled tokens over the number of ranks (float32: the ranks' losses average to the rows' loss), and this
        `ContextParallel` as ``omni_context_parallel``. A VLM's vision inputs are left out: hand its merged
        ``inputs_embeds`` instead, which are sharded."""
        labels = batch["labels"]
        shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=label_ignore_index)
        local = {key: self.shard(batch[key]) for key in ("input_ids", "inputs_embeds", "position_ids", "attention_mask")
                 if key in batch}
        local.update(labels=self.shard(labels), shift_labels=self.shard(shifted), omni_context_parallel=self,
                     num_items_in_batch=(shifted != label_ignore_index).sum() / self.world_size)
        return local

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                  softcap: float | None = None, window: int | None = None, images: bool = True) -> torch.Tensor:
        """omni attention of this shard's queries over the whole row, by `resolved_schedule`.

        Args:
            q: ``[B, Hq, stop - start, D]``; k, v: ``[B, Hkv, stop - start, D]``, this rank's keys and values.
            images: whether the image groups attend both ways in this layer; False where the model keeps images
                causal in it (Gemma 4's global layers): the rule of the doc ids alone, planned on its own.
        Returns:
            ``[B, Hq, stop - start, D]``, exactly what the whole row's attention gives these queries.
        """
        if q.shape[2] != self.stop - self.start:
            raise ValueError(f"q: expected this rank's {self.stop - self.start} tokens ({self.start}:{self.stop}), "
                             f"got {q.shape[2]}")
        if not images:
            return self.without_images().attention(q, k, v, scale=scale, softcap=softcap, window=window)
        schedule = self.resolved_schedule()
        if schedule == "all_gather":
            self._check_gatherable(window)
            keys, values = self._gather(k), self._gather(v)
            return omni_attention(q, keys, values, self.mask(q.shape[2], window, q.device), scale=scale,
                                  softcap=softcap)
        plan, transfers = self.plan(schedule, window)
        masks = self._pair_masks(plan, window, q.device)
        links = self._cached(("links", q.device, self.resolved_topology()),
                             lambda: Links(self.group, self.resolved_topology(), q.device))
        return paired_attention(q, k, v, plan, transfers, masks, self.start, links, scale, softcap)

    def without_images(self) -> ContextParallel:
        """These rows and cuts with every token text (no image groups), planned and cached on their own: what a layer
        that keeps images causal attends by."""
        return self._cached(("without images",), lambda: dataclasses.replace(
            self, group_ids=torch.full_like(self.group_ids, -1), cache={}))

    def resolved_topology(self) -> Topology:
        """`topology`, or the group's real nodes (`Topology.of_group`)."""
        return self.topology or self._cached(("topology",), lambda: Topology.of_group(self.group))

    def resolved_schedule(self) -> str:
        """`schedule`, with ``"auto"`` resolved by `choose_schedule` (one rank: ``direct``, which sends nothing)."""
        if self.schedule != "auto":
            return self.schedule
        if self.world_size == 1:
            return "direct"
        return choose_schedule(self.resolved_topology(), gatherable=self._later_pair(None) is None)

    def spans(self, window: int | None = None) -> np.ndarray:
        """`pair_spans` of the rows at these cuts (on the host, once per window)."""
        return self._cached(("spans", window), lambda: pair_spans(self.doc_ids.cpu().numpy(),
                                                                  self.group_ids.cpu().numpy(), self.bounds, window))

    def plan(self, schedule: str | None = None, window: int | None = None) -> tuple[RankPlan, tuple[Transfer, ...]]:
        """This rank's part of the plan of ``schedule`` (default `resolved_schedule`; not ``all_gather``) and every
        rank's transfers."""
        schedule = schedule or self.resolved_schedule()
        topology = self.resolved_topology() if self.world_size > 1 else Topology((0,))

        def build():
            transfers = plan_transfers(self.spans(window), schedule, topology)
            return rank_plan(self.spans(window), transfers, self.rank), transfers

        return self._cached(("plan", window, schedule, topology), build)

    def mask(self, q_len: int, window: int | None, device: torch.device) -> OmniBlockMask:
        """The mask of this shard's ``q_len`` queries over the row's keys up to its end (the ``all_gather``
        schedule's; built once per window and device)."""
        if q_len != self.stop - self.start:
            raise ValueError(f"q: expected this rank's {self.stop - self.start} tokens ({self.start}:{self.stop}), "
                             f"got {q_len}")

        def build():
            doc, grp = (ids[:, :self.stop].to(device) for ids in (self.doc_ids, self.group_ids))
            return OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, window=window)

        return self._cached(("mask", window, device), build)

    def _pair_masks(self, plan: RankPlan, window: int | None, device: torch.device) -> dict:
        """The mask of each pair of ``plan`` (`OmniBlockMask.from_token_id_ranges`), built once per window and
        device."""

        def build():
            doc, grp = (ids.to(device) for ids in (self.doc_ids, self.group_ids))
            return {pair: OmniBlockMask.from_token_id_ranges(doc, grp, pair.queries, pair.keys, window=window)
                    for pair in plan.pairs}

        return self._cached(("pair masks", window, device, plan), build)

    def _cached(self, key: tuple, build):
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    def _check_gatherable(self, window: int | None) -> None:
        """The ``all_gather`` schedule attends keys ``0:stop``: refuse cuts that leave a query seeing keys after its
        shard (an image split by a cut), which only the paired schedules attend."""
        later = self._later_pair(window)
        if later is not None:
            raise ValueError(f"schedule: 'all_gather' needs cuts between images, but bounds {self.bounds} split one "
                             f"(queries of shard {later[0]} see keys of shard {later[1]}); cut with "
                             "balanced_bounds or use the 'direct', 'ring' or 'hybrid' schedule")

    def _later_pair(self, window: int | None) -> tuple[int, int] | None:
        """A (query shard, later key shard) pair with an allowed pair (an image split by a cut), or None."""
        spans = self.spans(window)
        return next(((r, s) for r in range(self.world_size) for s in range(r + 1, self.world_size)
                     if spans[r, s, 1] > spans[r, s, 0]), None)

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """The keys (or values) of every shard up to this one's end, ``[B, H, stop, D]``: shards padded to the
        longest, all-gathered (`_AllGather`: the backward reduce-scatters the gradients to their owners), trimmed,
        joined. Over an emulated link each collective takes a piece's bytes times the other nodes over the link's
        rate more (each GPU's NIC brings its rail's pieces, as NCCL's rings across nodes do)."""
        longest = max(b - a for a, b in zip(self.bounds, self.bounds[1:]))
        padded = torch.nn.functional.pad(x, (0, 0, 0, longest - x.shape[2]))
        topology = self.resolved_topology()
        delay = 0.0 if topology.link_gb_s is None else (
            padded.numel() * padded.element_size() * (topology.nodes - 1) / (topology.link_gb_s * 1e9))
        pieces = _AllGather.apply(padded, self.group, delay).chunk(self.world_size)
        kept = [piece[:, :, :b - a] for piece, a, b in zip(pieces, self.bounds, self.bounds[1:])][:self.rank + 1]
        return torch.cat(kept, dim=2)


@dataclasses.dataclass(frozen=True)
class ContextParallelCollator:
    """A DataLoader's ``collate_fn`` for context parallelism: packs samples into rows with ``collator`` and returns
    this rank's shard of them (`ContextParallel.shard_batch`), so the cuts (`balanced_bounds`, on the host) are made
    in the loader's workers, ahead of the step. The ranks of one row must be given the same samples (a sampler over
    the data-parallel ranks only). The batch's ``omni_context_parallel`` has no process group: set it, and the
    device, with `ContextParallel.to` in the training process.

    Attributes:
        collator: makes a batch with ``omni_doc_ids``, ``omni_group_ids`` and ``labels`` (`omni_hf.OmniCollator`).
        world_size, rank: how many ranks share a row (the context-parallel size, not the global world size), and
            this process's rank among them.
        window: the sliding window of every layer, if all have one (balances by the work it leaves).
        token_cost: work per token outside attention, in (q, k) pairs (`token_work_in_pairs`).
        schedule: the shards' `ContextParallel.schedule`. Their key ranges (`ContextParallel.spans`) are found here,
            in the worker, for ``window``.
    """

    collator: Any
    world_size: int
    rank: int
    window: int | None = None
    token_cost: float = 0.0
    schedule: str = "auto"

    def __post_init__(self):
        if self.world_size < 1:
            raise ValueError(f"world_size: expected the number of ranks sharing a row (>= 1), got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank: expected 0 <= rank < world_size = {self.world_size}, got {self.rank}")
        _check_token_cost(self.token_cost)  # here, not first in a DataLoader worker
        if self.schedule not in ("auto", *SCHEDULES):
            raise ValueError(f"schedule: expected 'auto' or one of {SCHEDULES}, got {self.schedule!r}")

    def __call__(self, samples: list[dict]) -> dict[str, Any]:
        batch = self.collator(samples)
        missing = [key for key in ("omni_doc_ids", "omni_group_ids", "labels") if key not in batch]
        if missing:
            raise ValueError(f"collator: expected a packer whose batches hold omni_doc_ids, omni_group_ids and labels "
                             f"(omni_hf.OmniCollator), got {type(self.collator).__name__}, whose batch lacks "
                             f"{', '.join(missing)} (keys: {', '.join(sorted(batch))})")
        doc, grp = batch["omni_doc_ids"].to(torch.int32), batch["omni_group_ids"].to(torch.int32)
        bounds = balanced_bounds(doc.numpy(), grp.numpy(), self.world_size, self.window, self.token_cost)
        shard = ContextParallel(doc, grp, tuple(bounds), self.rank, schedule=self.schedule)
        shard.spans(self.window)
        return shard.shard_batch(batch)
