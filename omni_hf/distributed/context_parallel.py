"""Context parallelism: one packed row split across the ranks of a process group, attention exact over the whole row.

Each rank holds a contiguous shard of the row's tokens (queries, and the keys / values they produce). Attention
all-gathers the keys and values (a differentiable all-gather: its backward reduce-scatters dK / dV back to their
owners) and runs omni on the shard's queries against the keys that precede the shard's end, with the token rule read
from the row's ids. That is exact when no bidirectional group (image) straddles a shard boundary: a query then sees
keys after it only inside its own group, which ends inside its shard, and the keys before the shard's end are the
keys bottom-right alignment puts before its queries. `balanced_bounds` cuts rows only between groups, and balances the
shards by allowed (q, k) pairs rather than by tokens (a VLM row's later tokens see far more keys than its first).
So the kernels need nothing new: the shard's queries are the last ``stop - start`` positions of its keys.

    cp = ContextParallel.for_batch(batch["omni_doc_ids"], batch["omni_group_ids"])    # every rank, same batch
    local = cp.shard_batch(batch)                                                      # this rank's tokens
    loss = model(**local).loss                                                         # a stock model, "omni"
    loss.backward()                                                                    # then all-reduce the grads

``shard_batch`` hands the model ``omni_context_parallel`` (read by every omni attention layer), the shard's
positions, labels shifted across shard boundaries (``shift_labels``) and the whole row's count of labelled tokens
(``num_items_in_batch``), so the per-rank losses sum to the loss of the whole row. Communication: one all-gather of
K and V per layer in the forward, one reduce-scatter in the backward (the all-gather is the simple choice; a ring
that overlaps transfers with compute is the next step at more ranks, see docs/performance/context_parallel.md).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from ..mask import OmniBlockMask
from ..ops import omni_attention

__all__ = ["ContextParallel", "allowed_keys_per_query", "balanced_bounds"]


def allowed_keys_per_query(doc_ids: np.ndarray, group_ids: np.ndarray, window: int | None = None) -> np.ndarray:
    """int64 ``[B, S]``: how many keys each query row of the token rule sees (its share of the attention work).

    A query sees the keys of its document (same id, wherever it is) up to itself and within ``window``, and every
    key of its group (same document and group id) outside that; a padding query (doc -1) sees none. O(B S log S).
    """
    return np.stack([_allowed_keys(doc, grp, window) for doc, grp in zip(doc_ids, group_ids)]).astype(np.int64)


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


def balanced_bounds(doc_ids: np.ndarray, group_ids: np.ndarray, world_size: int,
                    window: int | None = None) -> list[int]:
    """Cut points ``[0, c_1, ..., S]`` splitting rows ``[B, S]`` into ``world_size`` shards of about equal attention
    work (`allowed_keys_per_query`, summed over the batch), each cut moved to the nearest position that splits no
    group of any row (so the shards' attention is exact, see the module docstring). Raises ValueError where that
    leaves a shard empty."""
    work = allowed_keys_per_query(doc_ids, group_ids, window).sum(0)
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


@dataclasses.dataclass(frozen=True, eq=False)
class ContextParallel:
    """This rank's shard of packed rows that a process group shares, as every omni attention layer reads it.

    Attributes:
        doc_ids, group_ids: int32 ``[B, S]``, the whole rows' token-rule ids (on the model's device).
        bounds: ``world_size + 1`` cut points; rank r holds tokens ``bounds[r]:bounds[r + 1]``.
        rank: this process's rank in ``group``.
        group: the process group (None: the default group).
        masks: the masks built so far, by sliding window (one build per forward serves every layer).
    """

    doc_ids: torch.Tensor
    group_ids: torch.Tensor
    bounds: tuple[int, ...]
    rank: int
    group: Any = None
    masks: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def for_batch(cls, doc_ids: torch.Tensor, group_ids: torch.Tensor, group: Any = None,
                  window: int | None = None) -> ContextParallel:
        """Split a collator batch's rows (``omni_doc_ids`` / ``omni_group_ids``, the same on every rank) over
        ``group``, balanced by `balanced_bounds` (``window``: the sliding window of the model's layers, if all have one)."""
        if not dist.is_initialized():
            raise RuntimeError("ContextParallel: expected an initialised torch.distributed process group, got none "
                               "(launch with torchrun or accelerate launch)")
        bounds = balanced_bounds(doc_ids.cpu().numpy(), group_ids.cpu().numpy(), dist.get_world_size(group), window)
        return cls(doc_ids.to(torch.int32), group_ids.to(torch.int32), tuple(bounds), dist.get_rank(group), group)

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
        predicts the next shard's first) and passed as ``shift_labels``, the row's count of labelled tokens as
        ``num_items_in_batch``, and this `ContextParallel` as ``omni_context_parallel``. A VLM's vision inputs are
        left out: hand its merged ``inputs_embeds`` instead, which are sharded."""
        labels = batch["labels"]
        shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=label_ignore_index)
        local = {key: self.shard(batch[key]) for key in ("input_ids", "inputs_embeds", "position_ids", "attention_mask")
                 if key in batch}
        local.update(labels=self.shard(labels), shift_labels=self.shard(shifted), omni_context_parallel=self,
                     num_items_in_batch=(shifted != label_ignore_index).sum())
        return local

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                  softcap: float | None = None, window: int | None = None) -> torch.Tensor:
        """omni attention of this shard's queries over the whole row.

        Args:
            q: ``[B, Hq, stop - start, D]``; k, v: ``[B, Hkv, stop - start, D]``, this rank's keys and values.
        Returns:
            ``[B, Hq, stop - start, D]``, exactly what the whole row's attention gives these queries.
        """
        keys = self._gather(k)
        values = self._gather(v)
        mask = self._mask(q.shape[2], window, q.device)
        return omni_attention(q, keys, values, mask, scale=scale, softcap=softcap)

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """The keys (or values) of every shard up to this one's end, ``[B, H, stop, D]``: shards padded to the
        longest, all-gathered (the backward reduce-scatters the gradients to their owners), trimmed, joined."""
        longest = max(b - a for a, b in zip(self.bounds, self.bounds[1:]))
        padded = torch.nn.functional.pad(x, (0, 0, 0, longest - x.shape[2]))
        with warnings.catch_warnings():  # deprecated in torch 2.13 for functional collectives, whose backward needs a
            warnings.simplefilter("ignore", FutureWarning)  # reduce-scatter that gloo lacks
            pieces = dist_fn.all_gather(padded, group=self.group)
        kept = [piece[:, :, :b - a] for piece, a, b in zip(pieces, self.bounds, self.bounds[1:])][:self.rank + 1]
        return torch.cat(kept, dim=2)

    def _mask(self, q_len: int, window: int | None, device: torch.device) -> OmniBlockMask:
        if q_len != self.stop - self.start:
            raise ValueError(f"q: expected this rank's {self.stop - self.start} tokens ({self.start}:{self.stop}), "
                             f"got {q_len}")
        if (window, device) not in self.masks:
            doc, grp = (ids[:, :self.stop].to(device) for ids in (self.doc_ids, self.group_ids))
            self.masks[window, device] = OmniBlockMask.from_token_ids(doc, grp, q_len=q_len, window=window)
        return self.masks[window, device]
