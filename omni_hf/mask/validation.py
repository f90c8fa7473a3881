"""Checks of builder arguments and of a whole `OmniBlockMask` (`OmniBlockMask.validate`): each raises a ValueError
or TypeError naming the argument or field, what was expected and what was received."""

from __future__ import annotations

import torch

from .lists import table_from_lists
from .token_ranges import token_ranges
from .types import BLOCK_SIZES, CAUSAL, FULL, PARTIAL, BlockType

__all__ = ["check_flag", "check_ids_from_minus_one", "check_sizes", "check_token_ids", "check_window", "describe_value",
           "validate"]


def check_sizes(q_len: int, kv_len: int, block_q: int, block_kv: int) -> None:
    for name, value in (("q_len", q_len), ("kv_len", kv_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    for name, value in (("block_q", block_q), ("block_kv", block_kv)):
        if value not in BLOCK_SIZES:
            raise ValueError(f"{name}: expected one of {BLOCK_SIZES}, got {value!r}")


def check_window(window) -> None:
    if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
        raise ValueError(f"window: expected a positive int or None, got {window!r}")


def check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {describe_value(value)}")


def check_token_ids(doc_ids, group_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise to int32 ``[B, kv_len]`` tensors on one device; group_ids None -> all text."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.dtype.is_floating_point or doc_ids.dtype == torch.bool:
        raise TypeError(f"doc_ids: expected an integer tensor, got {describe_value(doc_ids)}")
    if doc_ids.dim() == 1:
        doc_ids = doc_ids[None]
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids: expected shape [B, kv_len] or [kv_len], got {tuple(doc_ids.shape)}")
    if doc_ids.shape[1] == 0:
        raise ValueError(f"doc_ids: expected at least one token (kv_len >= 1), got an empty sequence, shape "
                         f"{tuple(doc_ids.shape)}")
    if group_ids is None:
        group_ids = torch.full_like(doc_ids, -1)
    if not isinstance(group_ids, torch.Tensor) or group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids: expected an integer tensor or None, got {describe_value(group_ids)}")
    if group_ids.dim() == 1:
        group_ids = group_ids[None]
    batches = doc_ids.shape[0], group_ids.shape[0]
    if (group_ids.dim() != 2 or group_ids.shape[1] != doc_ids.shape[1]
            or (batches[0] != batches[1] and 1 not in batches)):
        raise ValueError(f"group_ids: expected the shape of doc_ids {tuple(doc_ids.shape)} (a batch of 1 on either "
                         f"side broadcasts), got {tuple(group_ids.shape)}")
    if group_ids.device != doc_ids.device:
        raise ValueError(f"group_ids: expected device {doc_ids.device} (that of doc_ids), got {group_ids.device}")
    check_ids_from_minus_one("doc_ids", doc_ids, "padding")
    check_ids_from_minus_one("group_ids", group_ids, "causal text")
    batch = max(doc_ids.shape[0], group_ids.shape[0])
    return tuple(ids.to(torch.int32).expand(batch, -1).contiguous() for ids in (doc_ids, group_ids))


def check_ids_from_minus_one(name: str, ids: torch.Tensor, minus_one: str) -> None:
    """Token-rule ids must be -1 (what ``minus_one`` says it means: padding, causal text) or a non-negative id; raise a
    ValueError naming ``name``, the first offending value and where it is.

    Checked where the ids are on the CPU (one reduction over them; the collator's ids are there until they move to the
    model's device). On an accelerator, or while ``torch.compile`` traces, the check would cost a host sync, so those
    ids are taken as they are.
    """
    if ids.device.type != "cpu" or torch.compiler.is_compiling() or ids.numel() == 0 or int(ids.min()) >= -1:
        return
    where = tuple(int(i) for i in torch.nonzero(ids < -1)[0])
    raise ValueError(f"{name}: expected ids >= -1 (-1 = {minus_one}), got {int(ids[where])} at {list(where)}")


def describe_value(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of dtype {value.dtype} and shape {tuple(value.shape)}"
    return type(value).__name__


def validate(m) -> None:
    """All structural checks of `OmniBlockMask.validate` on mask ``m``."""
    check_sizes(m.q_len, m.kv_len, m.block_q, m.block_kv)
    check_window(m.window)
    check_flag("window_covers_groups", m.window_covers_groups)
    if m.implicit:
        held = [name for name in ("kv", "q", "partial_pool", "token_rule") if getattr(m, name) is not None]
        if held:
            raise ValueError(f"{held[0]}: expected None for an implicit mask (kind {m.kind.name}), got one")
        return
    nq, nk = m.num_q_blocks, m.num_kv_blocks
    pool_size = m.partial_pool.shape[0]
    expected_pool = (pool_size, m.block_q, m.block_kv // 32)
    if tuple(m.partial_pool.shape) != expected_pool or m.partial_pool.dtype != torch.int32:
        raise ValueError(f"partial_pool: expected int32 of shape {expected_pool}, got "
                         f"{describe_value(m.partial_pool)}")
    for prefix, lists, rows, cols in (("kv", m.kv, nq, nk), ("q", m.q, nk, nq)):
        _validate_lists(prefix, lists, m.batch, m.heads, rows, cols, pool_size)
    row_types, row_partial = m.block_table()
    col_types, col_partial = table_from_lists(m.q.num_blocks, m.q.indices, m.q.types, m.q.partial, nq)
    if not (torch.equal(row_types, col_types.transpose(-1, -2))
            and torch.equal(row_partial, col_partial.transpose(-1, -2))):
        raise ValueError("q.indices / q.types / q.partial: the column view does not list the same blocks, types "
                         "and pool ids as the row view")
    token_partial = (row_types == PARTIAL) & (row_partial < 0)
    if bool(token_partial.any()):
        if m.token_rule is None:
            raise ValueError("token_rule: PARTIAL blocks with pool id -1 use the token rule, which needs the "
                             "doc_ids and group_ids, got None")
        for name in ("doc_ids", "group_ids"):
            ids = getattr(m.token_rule, name)
            if (ids.dim() != 2 or ids.shape[1] != m.kv_len or ids.shape[0] not in (1, m.batch)
                    or ids.dtype != torch.int32):
                raise ValueError(f"token_rule.{name}: expected int32 [{m.batch} or 1, kv_len={m.kv_len}], got "
                                 f"{describe_value(ids)}")
        if m.q_len > m.kv_len:
            raise ValueError(f"q_len: the token rule needs q_len <= kv_len={m.kv_len}, got {m.q_len}")
    if m.token_rule is not None and m.token_rule.ranges is not None:
        _validate_token_ranges(m)


def _validate_token_ranges(m) -> None:
    """token_rule.ranges must be what `token_ranges` derives from the mask's ids and window (the kernels trust it)."""
    rule = m.token_rule
    expected = (rule.doc_ids.shape[0], m.kv_len, 4)
    if tuple(rule.ranges.shape) != expected or rule.ranges.dtype != torch.int32:
        raise ValueError(f"token_rule.ranges: expected int32 of shape {expected}, got {describe_value(rule.ranges)}")
    if not torch.equal(rule.ranges, token_ranges(rule.doc_ids, rule.group_ids, m.window, m.window_covers_groups)):
        raise ValueError("token_rule.ranges: differs from token_ranges(doc_ids, group_ids, window, "
                         "window_covers_groups); rebuild the mask with from_token_ids after changing its ids or window")


def _validate_lists(prefix, lists, batch, heads, rows, cols, pool_size) -> None:
    """Shapes, dtypes, ranges and ordering of one view's block lists."""
    num, idx, types, partial = lists.num_blocks, lists.indices, lists.types, lists.partial
    if tuple(num.shape) != (batch, heads, rows) or num.dtype != torch.int32:
        raise ValueError(f"{prefix}.num_blocks: expected int32 of shape {(batch, heads, rows)}, "
                         f"got {describe_value(num)}")
    max_blocks = idx.shape[-1] if idx.dim() == 4 else -1
    for name, tensor, dtype in (("indices", idx, torch.int32), ("types", types, torch.int8),
                                ("partial", partial, torch.int32)):
        if tuple(tensor.shape) != (batch, heads, rows, max_blocks) or tensor.dtype != dtype:
            raise ValueError(f"{prefix}.{name}: expected {dtype} of shape {(batch, heads, rows, 'maxBlocks')}, "
                             f"got {describe_value(tensor)}")
    if bool(((num < 0) | (num > max_blocks)).any()):
        raise ValueError(f"{prefix}.num_blocks: expected counts in [0, {max_blocks}], got min {int(num.min())} "
                         f"max {int(num.max())}")
    active = torch.arange(max_blocks, device=num.device) < num[..., None]
    if bool((active & ((idx < 0) | (idx >= cols))).any()):
        raise ValueError(f"{prefix}.indices: expected active indices in [0, {cols})")
    if bool((active[..., 1:] & (idx[..., 1:] <= idx[..., :-1])).any()):
        raise ValueError(f"{prefix}.indices: expected strictly ascending active indices")
    valid_type = (types == FULL) | (types == CAUSAL) | (types == PARTIAL)
    if bool((active & ~valid_type).any()):
        raise ValueError(f"{prefix}.types: expected FULL, CAUSAL or PARTIAL ({int(BlockType.FULL)}, "
                         f"{int(BlockType.CAUSAL)}, {int(BlockType.PARTIAL)}) for every active block")
    pooled = active & (types == PARTIAL)
    if bool((pooled & ((partial < -1) | (partial >= pool_size))).any()):
        raise ValueError(f"{prefix}.partial: expected pool ids in [-1, {pool_size}) for PARTIAL blocks")
    if bool((active & (types != PARTIAL) & (partial != -1)).any()):
        raise ValueError(f"{prefix}.partial: expected -1 for blocks that are not PARTIAL")
