"""Per-token ids of the token rule from spans: the packed samples of a row and the ranges of tokens (images) that
attend to each other both ways. `OmniBlockMask.from_spans` and `OmniCollator` both number tokens this way."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["span_group_ids", "token_ids_from_spans"]


def token_ids_from_spans(
    spans: Sequence[Sequence[tuple[int, int]]],
    seq_len: int,
    sample_lengths: Sequence[Sequence[int]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token ids of the token rule from per-row spans (see `OmniBlockMask.from_spans`).

    Args:
        spans: for each row, sorted non-overlapping ``(start, end)`` token ranges (end exclusive, positions within
            the row, each inside one packed sample) that attend to each other both ways.
        seq_len: length of every row.
        sample_lengths: for each row, the lengths of the samples packed into it from position 0 (what is left of
            the row is padding). Default: one sample filling the row.
    Returns:
        doc_ids, group_ids: int32 ``[len(spans), seq_len]``. ``doc`` numbers the packed samples of a
        row from 0 (-1 = padding); ``grp`` numbers the spans of a row from 0 (-1 = causal text).
    """
    rows = len(spans)
    if sample_lengths is None:
        sample_lengths = [[seq_len]] * rows
    if len(sample_lengths) != rows:
        raise ValueError(f"sample_lengths: expected one list per row ({rows}), got {len(sample_lengths)}")
    doc_ids = np.full((rows, seq_len), -1, dtype=np.int32)
    checked = []
    for row, (row_spans, lengths) in enumerate(zip(spans, sample_lengths)):
        bounds = np.cumsum([0, *lengths])
        if min(lengths, default=1) < 1 or bounds[-1] > seq_len:
            raise ValueError(f"sample_lengths[{row}]: expected positive lengths summing to at most "
                             f"seq_len={seq_len}, got {list(lengths)}")
        doc_ids[row, :bounds[-1]] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
        checked.append(_check_spans(np.asarray(row_spans, dtype=np.int64).reshape(-1, 2), bounds, row))
    span_row = np.repeat(np.arange(rows), [len(s) for s in checked])
    in_stream = np.concatenate([np.empty((0, 2), dtype=np.int64), *checked]) + (span_row * seq_len)[:, None]
    return doc_ids, span_group_ids(in_stream, span_row, rows * seq_len).reshape(rows, seq_len)


def span_group_ids(spans: np.ndarray, span_row: np.ndarray, length: int) -> np.ndarray:
    """int32 group id of every position of a stream of rows laid end to end: the spans numbered from 0 within
    their row, -1 elsewhere. Built run by run (text, span, text, span, ..., text) with one ``np.repeat``.

    Args:
        spans: int64 ``[k, 2]`` sorted, disjoint ``(start, end)`` positions in the stream.
        span_row: int ``[k]`` the row of each span, non-decreasing.
        length: positions in the stream.
    """
    group = np.arange(len(span_row)) - np.searchsorted(span_row, span_row)  # minus the spans of earlier rows
    bounds = np.concatenate([[0], spans.ravel(), [length]])
    values = np.full(2 * len(group) + 1, -1, dtype=np.int32)
    values[1::2] = group
    return np.repeat(values, np.diff(bounds))


def _check_spans(spans: np.ndarray, bounds: np.ndarray, row: int) -> np.ndarray:
    """Spans ``[n, 2]`` must be non-empty, sorted, disjoint and each inside one sample of ``bounds``."""
    start, end = spans[:, 0], spans[:, 1]
    if (start < 0).any() or (end > bounds[-1]).any() or (end <= start).any():
        raise ValueError(f"spans[{row}]: expected 0 <= start < end <= {bounds[-1]} (the row's tokens), "
                         f"got {spans.tolist()}")
    if (start[1:] < end[:-1]).any():
        raise ValueError(f"spans[{row}]: expected sorted, non-overlapping spans, got {spans.tolist()}")
    sample_of_start = np.searchsorted(bounds, start, side="right")
    sample_of_last = np.searchsorted(bounds, end - 1, side="right")
    if (sample_of_start != sample_of_last).any():
        raise ValueError(f"spans[{row}]: a span crosses a packed-sample boundary {bounds.tolist()}: {spans.tolist()}")
    return spans
