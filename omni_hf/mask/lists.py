"""Block tables and block lists: a dense per-block table ``[B, H, nRows, nCols]`` and the lists the kernels walk
(`BlockLists`: per row, its active columns ascending, their types and pool ids). Fixed shapes, no host sync."""

from __future__ import annotations

import torch

from .types import MASKED

__all__ = ["block_lists", "lists_from_table", "scatter_lists", "table_from_lists"]


def block_lists(types: torch.Tensor, partial: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Row-view lists from a block table ``[B, H, nRows, nCols]``: num, indices, types, pool ids.

    Fixed shapes (``maxBlocks = nCols``), no host sync: the active columns come first, ascending.
    ``partial`` None means no pooled blocks (all -1).
    """
    num, order = lists_from_table(types != MASKED)
    listed = order.long()
    pool_ids = (torch.full(order.shape, -1, dtype=torch.int32, device=order.device) if partial is None
                else partial.gather(-1, listed).to(torch.int32).contiguous())
    return num, order, types.gather(-1, listed).contiguous(), pool_ids


def lists_from_table(active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 counts and column indices, active columns first and ascending, of a bool table ``[..., nC]``.

    A stable partition by a cumulative sum (no sort): active column c goes to slot ``#active before c``;
    inactive columns all go to a spare slot ``nC`` that is dropped, so entries past the count are 0.
    Elementwise ops only with scalars: broadcasting integer ops are slow on the CPU.
    """
    columns = active.shape[-1]
    flag = active.to(torch.int32)
    rank = flag.cumsum(-1, dtype=torch.int32)  # active columns up to and including c
    slot = (rank - (columns + 1)) * flag + columns
    index = torch.arange(columns, dtype=torch.int32, device=active.device).expand(active.shape)
    order = torch.zeros(*active.shape[:-1], columns + 1, dtype=torch.int32, device=active.device)
    order.scatter_(-1, slot.long(), index)
    return rank[..., -1].contiguous(), order[..., :columns].contiguous()


def table_from_lists(num, indices, types, partial, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of `block_lists`: types int8 and pool ids int32 ``[B, H, nRows, columns]``."""
    return (scatter_lists(num, indices, types.to(torch.int8), columns, fill=0),
            scatter_lists(num, indices, partial.to(torch.int32), columns, fill=-1))


def scatter_lists(num, indices, values: torch.Tensor, columns: int, fill) -> torch.Tensor:
    """Each row's active list entries ``values`` placed at their column of a ``[..., columns]`` table, ``fill``
    elsewhere; inactive entries land in a spare column that is dropped."""
    active = torch.arange(indices.shape[-1], device=indices.device) < num[..., None]
    column = torch.where(active, indices.long(), columns)
    table = torch.full((*indices.shape[:-1], columns + 1), fill, dtype=values.dtype, device=values.device)
    return table.scatter_(-1, column, values)[..., :columns]
