"""Context-parallel attention that overlaps the K / V exchange with compute: a rank's plan (`omni_hf.distributed.plan`)
run as point-to-point transfers, one batched call per round, while the rank attends its queries to the keys it holds.

Forward: round 0 starts (the rank's own key ranges out, the ranges it needs in); the rank attends to its own shard;
then, round by round, it waits for that round's keys, starts the next round (forwarding what ranks further on need)
and attends to the keys just arrived. Each call returns its output and LSE; they are merged exactly (log-sum-exp),
in float32. Backward, in reverse: the calls of the last round's keys first, their dK / dV sent back (through the
same relays, each adding its own part) while the earlier calls run; a call's backward takes the merged output and
LSE, so its dq, dk, dv are its share of the whole softmax's gradients.

On a GPU, rounds after the first are issued from a stream of their own, so that a relay waits for its data but not
for the attention queued before it; the compute stream waits for each round's data by an event. On one host an
emulated link between nodes (`Topology.emulated`) holds each round's cross-node data back to the link's rate: a
spin of the GPU on that stream (``torch.cuda._sleep``), on the CPU a sleep of the host.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import torch
import torch.distributed as dist

from ..ops.attention import backward_call, forward_call, prepare_call
from .plan import RankPlan, Topology, Transfer

__all__ = ["Links", "emulated_delays", "paired_attention", "pause"]


def pause(seconds: float, device: torch.device) -> None:
    """Hold the work after this point back ``seconds``: on a GPU a spin of its current stream (the host goes on),
    on the CPU a sleep."""
    if seconds <= 0:
        return
    if device.type == "cuda":
        torch.cuda._sleep(int(seconds * _cycles_per_second(device.index)))
    else:
        time.sleep(seconds)


@functools.cache
def _cycles_per_second(device_index: int | None) -> float:
    """The rate of ``torch.cuda._sleep``'s cycles on a GPU, timed once."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 1 << 24
    with torch.cuda.device(device_index):
        torch.cuda._sleep(cycles)  # the first launch pays for loading the kernel
        begin.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / (begin.elapsed_time(end) / 1e3)


class _Round:
    """One round's transfers in flight; `wait` makes their data usable where the work runs (the current CUDA stream,
    or the host). It holds the round's tensors until then: waiting for a NCCL work lets the caching allocator
    recycle the tensors the work held, and on the comm stream that would be before the compute stream, where they
    were made, is done with the transfers."""

    def __init__(self, works: list, delay_s: float, stream, tensors: list[torch.Tensor]):
        self.works, self.delay_s, self.stream, self.tensors = works, delay_s, stream, tensors
        self.started = time.perf_counter()
        self.event = None
        if stream is not None:  # the data's arrival, and the emulated link's extra time, on the comm stream
            with torch.cuda.stream(stream):
                for work in works:
                    work.wait()
                pause(delay_s, torch.device("cuda", stream.device.index))
                self.event = torch.cuda.Event()
                self.event.record(stream)

    def wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream(self.stream.device).wait_event(self.event)
        else:
            for work in self.works:
                work.wait()
            time.sleep(max(0.0, self.started + self.delay_s - time.perf_counter()))
        self.works, self.delay_s, self.tensors = [], 0.0, []


class Links:
    """One rank's point-to-point transfers on a process group, a round at a time (one ``batch_isend_irecv`` per
    round, so that NCCL matches each round's sends and receives together), each round held back as long as the
    caller says (`emulated_delays`)."""

    def __init__(self, group: Any, topology: Topology, device: torch.device):
        self.group, self.topology, self.device = group, topology, device
        self.rank = dist.get_rank(group)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        _connect(group, device)

    def start(self, sends: list[tuple[int, torch.Tensor, int]], receives: list[tuple[int, torch.Tensor, int]],
              delay_s: float, after: _Round | None = None) -> _Round:
        """Start the transfers ``(peer, tensor, tag)`` of a round. ``after``: the round whose data this one forwards
        (its transfers start once that data is in: on a GPU behind it on the comm stream, with nothing else
        waited for; on the CPU once the host has it)."""
        if after is not None and self.stream is None:
            after.wait()
        ops = [dist.P2POp(op, tensor, self._global(peer), self.group, tag) for op, items in
               ((dist.isend, sends), (dist.irecv, receives)) for peer, tensor, tag in items]
        if not ops:
            return _Round([], 0.0, self.stream, [])
        if after is not None and self.stream is not None:
            with torch.cuda.stream(self.stream):
                works = dist.batch_isend_irecv(ops)
        else:
            works = dist.batch_isend_irecv(ops)
        return _Round(works, delay_s, self.stream, [op.tensor for op in ops])

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)


def emulated_delays(transfers: tuple[Transfer, ...], rank: int, topology: Topology, rounds: int, token_bytes: int,
                    backward: bool) -> list[float]:
    """Seconds each round's data of ``rank`` takes over an emulated link (`Topology.link_gb_s`; 0 without one): the
    larger of the bytes it receives across nodes and of those its busiest cross-node sender sends in that round, over
    the link's rate (``token_bytes``: one position's K and V). Backward: dK / dV go back the way K / V came."""
    if topology.link_gb_s is None:
        return [0.0] * rounds
    crossing = [t for t in transfers if topology.node_of[t.src] != topology.node_of[t.dst]]
    if backward:
        crossing = [dataclasses.replace(t, src=t.dst, dst=t.src) for t in crossing]
    delays = []
    for step in range(rounds):
        now = [t for t in crossing if t.round == step]
        sent = {}
        for t in now:
            sent[t.src] = sent.get(t.src, 0) + t.stop - t.start
        into = [t for t in now if t.dst == rank]
        tokens = max([sum(t.stop - t.start for t in into), *(sent[t.src] for t in into)])
        delays.append(tokens * token_bytes / (topology.link_gb_s * 1e9))
    return delays


_connected: dict[int, Any] = {}


def _connect(group: Any, device: torch.device) -> None:
    """One collective on a group before its first point-to-point batch (NCCL asks that every rank take part in a
    group's first call)."""
    if device.type == "cuda" and id(group) not in _connected:
        dist.all_reduce(torch.zeros(1, device=device), group=group)
        _connected[id(group)] = group  # held, so that the id is not reused


class _PairedAttention(torch.autograd.Function):
    """``forward(q, k, v, layer) -> out``: `_Layer.forward` with its backward."""

    @staticmethod
    def forward(ctx, q, k, v, layer):
        out, lse, buffers = layer.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse, *buffers)
        ctx.layer = layer
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, *buffers = ctx.saved_tensors
        return (*ctx.layer.backward(dout, q, k, v, out, lse, buffers), None)


def paired_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: RankPlan,
                     transfers: tuple[Transfer, ...], masks: dict, start: int, links: Links, scale: float | None,
                     softcap: float | None) -> torch.Tensor:
    """This rank's queries ``q`` ``[B, Hq, L, D]`` over the keys its plan brings, its own being ``k``, ``v``
    ``[B, Hkv, L, D]`` (positions ``start:start + L``); ``masks``: each `Pair`'s mask. Differentiable in q, k, v."""
    return _PairedAttention.apply(q, k, v, _Layer(plan, transfers, masks, start, links, scale, softcap))


class _Layer:
    """One layer's run of a rank's plan: the forward and the backward of `paired_attention`."""

    def __init__(self, plan: RankPlan, transfers, masks: dict, start: int, links: Links, scale, softcap):
        self.plan, self.transfers, self.masks, self.start, self.links = plan, transfers, masks, start, links
        self.scale, self.softcap = scale, softcap

    # ------------------------------------------------------------------ forward

    def forward(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        plan, links = self.plan, self.links
        token_shape = (2, k.shape[0], k.shape[1], k.shape[3])  # a token's K and V: [2, B, Hkv, D]
        buffers = [k.new_empty((t.stop - t.start, *token_shape)) for t in plan.receives]
        held = {t.chunk: (t.start, b) for t, b in zip(plan.receives, buffers)}
        delays = emulated_delays(self.transfers, plan.rank, links.topology, plan.rounds, _token_bytes(k), False)

        def rows_to_send(t: Transfer) -> torch.Tensor:
            """The token-major K and V a transfer sends: of the own shard a copy (round 0 only, on the compute
            stream); of a received buffer its rows, contiguous as they are (no copy, so nothing runs before they
            arrive)."""
            if t.chunk != plan.rank:
                return _rows(held[t.chunk], t.start, t.stop)
            rows = slice(t.start - self.start, t.stop - self.start)
            return torch.stack((k[:, :, rows], v[:, :, rows])).permute(3, 0, 1, 2, 4).contiguous()

        def start_round(step: int, after: _Round | None) -> _Round:
            sends = [(t.dst, rows_to_send(t), t.chunk) for t in plan.sends if t.round == step]
            receives = [(t.src, b, t.chunk) for t, b in zip(plan.receives, buffers) if t.round == step]
            return links.start(sends, receives, delays[step], after)

        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        pending = start_round(0, None) if plan.rounds else None
        self._attend_round(-1, q, k, v, held, out, lse)
        for step in range(plan.rounds):
            arrived = pending
            pending = start_round(step + 1, arrived) if step + 1 < plan.rounds else None
            arrived.wait()
            self._attend_round(step, q, k, v, held, out, lse)
        return out.to(q.dtype), lse, buffers

    def _round_calls(self, step, q, k, v, held):
        """The pairs whose keys arrive in round ``step``, each as ``(pair, rows, keys, values, call)``: its query rows
        of this shard (a slice), its keys and values (views) and the prepared call of ``q[:, :, rows]`` over them."""
        for pair in self.plan.pairs:
            if pair.round != step:
                continue
            rows = slice(pair.queries[0] - self.start, pair.queries[1] - self.start)
            keys, values = self._keys(pair, k, v, held)
            yield pair, rows, keys, values, prepare_call(q[:, :, rows], keys, values, self.masks[pair], self.scale,
                                                         self.softcap)

    def _attend_round(self, step, q, k, v, held, out, lse) -> None:
        """The calls of the keys that arrive in round ``step``, merged into ``out`` / ``lse`` (float32)."""
        for _, rows, keys, values, call in self._round_calls(step, q, k, v, held):
            part, part_lse = forward_call(call, q[:, :, rows], keys, values)
            _merge(out[:, :, rows], lse[:, :, rows], part, part_lse)

    def _keys(self, pair, k, v, held) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values ``[B, Hkv, l, D]`` of a pair (views)."""
        if pair.chunk == self.plan.rank:
            keys = slice(pair.keys[0] - self.start, pair.keys[1] - self.start)
            return k[:, :, keys], v[:, :, keys]
        both = _rows(held[pair.chunk], *pair.keys).permute(1, 2, 3, 0, 4)  # [2, B, Hkv, l, D]
        return both[0], both[1]

    # ------------------------------------------------------------------ backward

    def backward(self, dout, q, k, v, out, lse, buffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        plan, links = self.plan, self.links
        held = {t.chunk: (t.start, b) for t, b in zip(plan.receives, buffers)}
        own_shape = (k.shape[2], 2, k.shape[0], k.shape[1], k.shape[3])
        grads = {plan.rank: (self.start, torch.zeros(own_shape, dtype=torch.float32, device=k.device)),
                 **{chunk: (base, torch.zeros(b.shape, dtype=torch.float32, device=b.device))
                    for chunk, (base, b) in held.items()}}
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        delays = emulated_delays(self.transfers, plan.rank, links.topology, plan.rounds, _token_bytes(k), True)
        step_args = (dout, q, k, v, out, lse, held, grads, dq)
        self._backward_round(plan.rounds - 1, *step_args)
        for step in reversed(range(plan.rounds)):  # dK / dV of round `step`'s keys back to where they came from
            sends = [(t.src, grads[t.chunk][1].to(k.dtype), t.chunk) for t in plan.receives if t.round == step]
            receives = [(t.dst, k.new_empty((t.stop - t.start, *grads[t.chunk][1].shape[1:])), t.chunk)
                        for t in plan.sends if t.round == step]
            returned = links.start(sends, receives, delays[step])
            self._backward_round(step - 1, *step_args)
            returned.wait()
            for t, (_, grad, _) in zip((t for t in plan.sends if t.round == step), receives):
                _rows(grads[t.chunk], t.start, t.stop).add_(grad)
        own = grads[plan.rank][1].permute(1, 2, 3, 0, 4)  # [2, B, Hkv, L, D]
        return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype)

    def _backward_round(self, step, dout, q, k, v, out, lse, held, grads, dq) -> None:
        """The backward of the calls of round ``step``'s keys: dq into ``dq``, dK / dV into their chunk's grads."""
        for pair, rows, keys, values, call in self._round_calls(step, q, k, v, held):
            dq_part, dk, dv = backward_call(call, dout[:, :, rows], q[:, :, rows], keys, values, out[:, :, rows],
                                            lse[:, :, rows])
            dq[:, :, rows] += dq_part
            target = _rows(grads[pair.chunk], *pair.keys).permute(1, 2, 3, 0, 4)
            target[0] += dk
            target[1] += dv


def _token_bytes(k: torch.Tensor) -> int:
    """Bytes of one position's keys and values, every row and head (``k``: ``[B, Hkv, L, D]``)."""
    return 2 * k.shape[0] * k.shape[1] * k.shape[3] * k.element_size()


def _rows(held: tuple[int, torch.Tensor], start: int, stop: int) -> torch.Tensor:
    """Positions ``start:stop`` of a token-major tensor ``[l, ...]`` that holds positions from ``held[0]`` on."""
    base, tensor = held
    return tensor[start - base:stop - base]


def _merge(out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor) -> None:
    """Merge a call's output ``part`` ``[B, Hq, l, D]`` and LSE into the float32 ``out`` / ``lse`` views of the same
    rows, in place: the softmax over both calls' keys (rows with no key in either stay 0 with LSE -inf)."""
    merged = torch.logaddexp(lse, part_lse)
    finite = torch.where(torch.isfinite(merged), merged, 0.0)
    out.mul_(torch.exp(lse - finite)[..., None]).add_(part.float() * torch.exp(part_lse - finite)[..., None])
    lse.copy_(merged)
