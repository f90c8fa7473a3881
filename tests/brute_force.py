"""Independent dense definitions of the masks and of attention, for tests only (S x S is fine here)."""

from __future__ import annotations

import torch


def causal_dense(q_len: int, kv_len: int) -> torch.Tensor:
    """bool [q_len, kv_len]: query i (absolute position i + kv_len - q_len) sees keys at or before it."""
    qpos = torch.arange(q_len)[:, None] + (kv_len - q_len)
    return qpos >= torch.arange(kv_len)[None, :]


def token_rule_dense(doc: torch.Tensor, grp: torch.Tensor, q_len: int, window: int | None = None) -> torch.Tensor:
    """bool [B, 1, q_len, kv_len] of the token rule, written from its definition in DESIGN.md."""
    kv_len = doc.shape[-1]
    doc, grp = doc.long(), grp.long()
    i = torch.arange(kv_len - q_len, kv_len)[:, None]
    j = torch.arange(kv_len)[None, :]
    q_doc, k_doc = doc[:, i], doc[:, j]
    q_grp, k_grp = grp[:, i], grp[:, j]
    near = (j <= i) if window is None else (j <= i) & (i - j < window)
    allowed = (q_doc >= 0) & (q_doc == k_doc) & (near | ((q_grp >= 0) & (q_grp == k_grp)))
    return allowed[:, None]


def spans_dense(spans, seq_len: int, sample_lengths=None) -> torch.Tensor:
    """bool [B, 1, S, S] straight from spans: same sample and (causal or same span); padding sees nothing."""
    rows = []
    for r, row_spans in enumerate(spans):
        lengths = [seq_len] if sample_lengths is None else sample_lengths[r]
        allowed = torch.zeros(seq_len, seq_len, dtype=torch.bool)
        start = 0
        for length in lengths:
            allowed[start:start + length, start:start + length] = torch.ones(length, length).tril().bool()
            start += length
        for a, b in row_spans:
            allowed[a:b, a:b] = True
        rows.append(allowed)
    return torch.stack(rows)[:, None]


def naive_attention(q, k, v, allowed, scale, softcap=None):
    """float64 softmax attention with autograd; rows with no allowed key give 0 (and zero gradient).

    q [B, Hq, Sq, D], k/v [B, Hkv, Skv, D] (K/V heads repeated here, on purpose unlike the reference),
    allowed bool broadcastable to [B, Hq, Sq, Skv]. Returns out [B, Hq, Sq, D] and lse [B, Hq, Sq].
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    allowed = allowed.expand_as(s)
    has_key = allowed.any(-1, keepdim=True)
    s = torch.where(allowed, s, float("-inf"))
    s = torch.where(has_key, s, 0.0)
    p = torch.softmax(s, dim=-1) * has_key
    lse = torch.where(has_key, torch.logsumexp(s, -1, keepdim=True), float("-inf")).squeeze(-1)
    return torch.einsum("bhqk,bhkd->bhqd", p, v.double()), lse


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    x, ref = x.detach().double(), ref.detach().double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))
