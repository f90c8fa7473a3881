"""`token_ranges` against the token rule's dense definition: on rows whose ids allow ranges, each position's range as
a query is exactly its row of allowed keys and its range as a key exactly its column of allowed queries; rows whose
ids do not (an id in two runs, ids not increasing along the row, a group across documents) are marked, and are
told apart by a run-by-run reading of the ids written here, not by the code under test."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omni_hf import OmniBlockMask
from omni_hf.mask import RANGE_INEXACT, token_ranges
from tests.helpers.brute_force import packed_vlm_ids, random_token_ids, token_rule_dense

SETTINGS = settings(max_examples=80, deadline=None)
WINDOWS = st.one_of(st.none(), st.integers(1, 300))


def ranges_allowed(doc: torch.Tensor, grp: torch.Tensor) -> list[bool]:
    """Per batch row: every document id >= 0 and every group id >= 0 (on real tokens, split where the document
    changes) covers one run, and each run's id is greater than every id of its kind before it in the row."""
    verdicts = []
    for d_row, g_row in zip(doc.tolist(), grp.tolist()):
        g_row = [g if d >= 0 else -1 for d, g in zip(d_row, g_row)]
        keys = {"doc": d_row, "grp": list(zip(d_row, g_row))}
        ok = True
        for kind, row in keys.items():
            seen = -1
            for p, key in enumerate(row):
                value = key if kind == "doc" else key[1]
                if value >= 0 and (p == 0 or row[p - 1] != key):
                    ok &= value > seen
                seen = max(seen, value)
        verdicts.append(ok)
    return verdicts


def assert_ranges_are_the_token_rule(doc: torch.Tensor, grp: torch.Tensor, window: int | None,
                                     window_covers_groups: bool = False) -> list[bool]:
    ranges = token_ranges(doc, grp, window, window_covers_groups)
    assert ranges.dtype == torch.int32 and ranges.shape == (*doc.shape, 4)
    allowed = token_rule_dense(doc, grp, doc.shape[1], window, window_covers_groups)[:, 0]
    positions = torch.arange(doc.shape[1])
    verdicts = ranges_allowed(doc, grp)
    for b, exact in enumerate(verdicts):
        if not exact:
            assert bool((ranges[b] == RANGE_INEXACT).all()), f"row {b}: ids without ranges must be marked"
            continue
        first_key, last_key, first_query, last_query = ranges[b].unbind(-1)
        as_query = (first_key[:, None] <= positions[None]) & (positions[None] <= last_key[:, None])
        as_key = (first_query[:, None] <= positions[None]) & (positions[None] <= last_query[:, None])
        assert torch.equal(as_query, allowed[b]), f"row {b}: ranges as queries"
        assert torch.equal(as_key, allowed[b].T), f"row {b}: ranges as keys"
    return verdicts


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(1, 700), WINDOWS)
def test_ranges_of_packed_rows_are_exactly_the_token_rule(seed, length, window):
    doc, grp = packed_vlm_ids(3, length, seed, doc_range=(1, 300), text_range=(0, 40), gaps=True)
    assert all(assert_ranges_are_the_token_rule(doc, grp, window))


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(1, 700), WINDOWS)
def test_ranges_are_exact_or_marked_on_ids_with_shared_and_split_runs(seed, length, window):
    doc, grp = random_token_ids(4, length, seed)
    assert_ranges_are_the_token_rule(doc, grp, window)


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(1, 700), st.integers(1, 300))
def test_ranges_with_the_window_over_groups_are_exactly_that_rule(seed, length, window):
    """The window cuts image pairs too (images of 1 to 200 keys against windows of 1 to 300): each position's keys
    and queries are still one range on collator-like rows, and ids without ranges are still marked."""
    doc, grp = packed_vlm_ids(3, length, seed, doc_range=(1, 300), text_range=(0, 40), image_range=(1, 200), gaps=True)
    assert all(assert_ranges_are_the_token_rule(doc, grp, window, window_covers_groups=True))
    assert_ranges_are_the_token_rule(*random_token_ids(4, length, seed), window, window_covers_groups=True)


@pytest.mark.parametrize("doc, grp", [
    ([0, 0, 1, 1, 0], [-1] * 5),            # a document in two runs
    ([0, 0, -1, 0, 0], [-1] * 5),           # padding splits a document
    ([1, 1, 0, 0, 0], [-1] * 5),            # one run each, but ids decrease
    ([0, 0, 0, 1, 1], [-1, 3, 3, 3, -1]),   # a group across two documents
    ([0, 0, 0, 0, 0], [2, 2, -1, 1, 1]),    # groups numbered backwards
])
def test_rows_without_ranges_are_marked_and_other_rows_keep_theirs(doc, grp):
    good_doc, good_grp = [0, 0, 0, 1, 1], [-1, 0, 0, -1, 1]
    ids = torch.tensor([doc, good_doc], dtype=torch.int32), torch.tensor([grp, good_grp], dtype=torch.int32)
    assert assert_ranges_are_the_token_rule(*ids, None) == [False, True]


def test_real_size_ranges_match_the_rule_on_sampled_rows():
    """32k tokens of collator-like ids: every row exact, ranges equal to dense rows and columns at sampled positions."""
    doc, grp = packed_vlm_ids(2, 32768, seed=7, gaps=True)
    ranges = token_ranges(doc, grp, 4096)
    assert ranges_allowed(doc, grp) == [True, True]
    positions = torch.arange(32768)
    for p in torch.randint(0, 32768, (64,), generator=torch.Generator().manual_seed(0)).tolist():
        for b in range(2):
            d, g = doc[b, p], grp[b, p]
            near_q = (positions <= p) & (p - positions < 4096)
            near_k = (positions >= p) & (positions - p < 4096)
            same = (d >= 0) & (doc[b] == d)
            row = same & (near_q | ((g >= 0) & (grp[b] == g)))
            col = same & (near_k | ((g >= 0) & (grp[b] == g)))
            lo, hi, qlo, qhi = ranges[b, p].tolist()
            assert torch.equal(row, (positions >= lo) & (positions <= hi))
            assert torch.equal(col, (positions >= qlo) & (positions <= qhi))


def test_from_token_ids_carries_ranges_and_validate_rejects_stale_ones():
    doc, grp = packed_vlm_ids(2, 300, seed=3, gaps=True)
    mask = OmniBlockMask.from_token_ids(doc, grp, window=50)
    assert torch.equal(mask.token_rule.ranges, token_ranges(doc, grp, 50))
    mask.validate()
    for stale in (dataclasses.replace(mask, window=60), dataclasses.replace(mask, window_covers_groups=True)):
        with pytest.raises(ValueError, match="token_rule.ranges: differs"):
            stale.validate()
    cut = dataclasses.replace(mask.token_rule, ranges=mask.token_rule.ranges[:, :-1])
    with pytest.raises(ValueError, match="token_rule.ranges: expected int32"):
        dataclasses.replace(mask, token_rule=cut).validate()
