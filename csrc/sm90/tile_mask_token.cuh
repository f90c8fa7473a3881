// PARTIAL tiles by the token rule, applied straight to the wgmma score fragment (registers are not the limit
// here, unlike sm_80's bits-before-GEMM scheme). A thread holds 2 rows and 16 pairs of neighbouring columns:
// each row's ids are read once and each column pair's ids with one 8-byte load per id array.
#pragma once
#include <cute/tensor.hpp>

#include <climits>
#include <cmath>
#include <type_traits>

#include "omni_attention.h"

namespace omni::sm90 {

using namespace cute;

// s_rc / c_rc: the scores and their in-tile (row, col) coordinates as (rows, cols); row_ids / col_ids: the staged
// [doc, grp] ids of the tile's kRows rows / kCols columns (tile_aux.cuh), whose first positions are row_pos0 /
// col_pos0. The rows are queries and the columns keys (forward, S), or the other way round with kRowsAreKeys
// (backward, S^T). mask_rule.cuh's token_allowed with everything that depends on the row alone done once per
// row. The rule is symmetric in the two ids (doc >= 0 and equal on both sides is doc >= 0 on one side and
// equal), so per element it is the doc compare, the group compare and a compare of the column's offset
// `off` from the thread's first column against d = row position - position of that first column:
//   queries as rows: key <= query <=> off <= d;  query - key < window <=> off > d - window;
//   keys as rows:    key <= query <=> off >= d;  query - key < window <=> off < d + window.
// Without a window (window <= 0) the second test is compiled out; with one it cuts the causal part, and group pairs
// too where m.window_covers_groups (a uniform runtime value, not a third compiled variant). The budget is tight: a
// third variant or one more operation per element makes ptxas serialize the softcapped forward's wgmma, which is
// why a negative row id is replaced by INT_MIN once per row instead of tested per element.
template <int kRows, int kCols, bool kRowsAreKeys = false, class TS, class TC>
__forceinline__ __device__ void mask_token_rule(TS& s_rc, const TC& c_rc, const int* row_ids, const int* col_ids,
                                                int row_pos0, int col_pos0, const OmniMask& m) {
  static_assert(decltype(size<1>(s_rc))::value % 2 == 0, "columns come in pairs");
  constexpr int kThreadRows = decltype(size<0>(s_rc))::value;
  const int window = m.window;
  const int jj0 = get<1>(c_rc(0, 0));  // this thread's first column; the others are constant offsets from it
  const bool groups_spared = m.window_covers_groups == 0;  // the window leaves group pairs alone
  // A row's ids, INT_MIN where negative (padding, text): no column id (>= -1) equals that, so one compare per id
  // tests both "the row's id is >= 0" and "the column's is the same".
  int r_doc[kThreadRows], r_grp[kThreadRows], d[kThreadRows];
  CUTE_UNROLL
  for (int r = 0; r < kThreadRows; ++r) {
    const int ii = get<0>(c_rc(r, 0));
    r_doc[r] = row_ids[ii] >= 0 ? row_ids[ii] : INT_MIN;
    r_grp[r] = row_ids[kRows + ii] >= 0 ? row_ids[kRows + ii] : INT_MIN;
    d[r] = row_pos0 + ii - col_pos0 - jj0;
  }
  auto apply = [&](auto has_window) {
    // Columns outer, rows inner: only one pair's ids are live at a time.
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); c += 2) {
      const int jj = get<1>(c_rc(0, c));  // even: the pair (jj, jj + 1) is 8-byte aligned
      const int2 c_doc = *reinterpret_cast<const int2*>(col_ids + jj);
      const int2 c_grp = *reinterpret_cast<const int2*>(col_ids + kCols + jj);
      CUTE_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int off = jj - jj0 + e;
        const int cd = e == 0 ? c_doc.x : c_doc.y;
        const int cg = e == 0 ? c_grp.x : c_grp.y;
        CUTE_UNROLL
        for (int r = 0; r < kThreadRows; ++r) {
          // Bitwise, not short-circuit, operators: predicates and one select per element, no branches.
          bool causal = kRowsAreKeys ? off >= d[r] : off <= d[r];
          bool group = cg == r_grp[r];
          if constexpr (decltype(has_window)::value) {
            const bool inside = kRowsAreKeys ? off < d[r] + window : off > d[r] - window;
            causal &= inside;
            group &= inside | groups_spared;
          }
          const bool allowed = (cd == r_doc[r]) & (causal | group);
          s_rc(r, c + e) = allowed ? s_rc(r, c + e) : -INFINITY;
        }
      }
    }
  };
  if (window <= 0) {
    apply(std::false_type{});
  } else {
    apply(std::true_type{});
  }
}

// The token rule where its rows are ranges (token_ranges_apply): row r allows the columns at positions
// [first, last] of its staged pair row_ranges[2 * r .. 2 * r + 1] (tile_aux.cuh), whichever side the rows are.
// Two compares of a compile-time column offset per element, no column data.
template <class TS, class TC>
__forceinline__ __device__ void mask_token_ranges(TS& s_rc, const TC& c_rc, const int* row_ranges, int col_pos0) {
  constexpr int kThreadRows = decltype(size<0>(s_rc))::value;
  const int jj0 = get<1>(c_rc(0, 0));  // this thread's first column; the others are constant offsets from it
  int first[kThreadRows], last[kThreadRows];  // relative to that column
  CUTE_UNROLL
  for (int r = 0; r < kThreadRows; ++r) {
    const int2 range = *reinterpret_cast<const int2*>(row_ranges + 2 * get<0>(c_rc(r, 0)));
    first[r] = range.x - col_pos0 - jj0;
    last[r] = range.y - col_pos0 - jj0;
  }
  CUTE_UNROLL
  for (int c = 0; c < size<1>(s_rc); ++c) {
    const int off = get<1>(c_rc(0, c)) - jj0;
    CUTE_UNROLL
    for (int r = 0; r < kThreadRows; ++r) {
      s_rc(r, c) = (off >= first[r]) & (off <= last[r]) ? s_rc(r, c) : -INFINITY;
    }
  }
}

}  // namespace omni::sm90
