// PARTIAL tiles by the token rule, applied straight to the wgmma score fragment (registers are not the limit
// here, unlike sm_80's bits-before-GEMM scheme). A thread holds 2 rows and 16 pairs of neighbouring columns:
// each row's ids are read once and each column pair's ids with one 8-byte load per id array.
#pragma once
#include <cute/tensor.hpp>

#include <cmath>

#include "mask_rule.cuh"

namespace omni::sm90 {

using namespace cute;

// s_rc / c_rc: the scores and their in-tile (row, col) coordinates as (rows, cols); q_ids / k_ids: the staged
// [doc, grp] ids of the tile's kRows rows / kCols columns (tile_aux.cuh). window <= 0 drops the window test.
template <int kRows, int kCols, class TS, class TC>
__forceinline__ __device__ void mask_token_rule(TS& s_rc, const TC& c_rc, const int* q_ids, const int* k_ids,
                                                int qpos0, int col0, int window) {
  static_assert(decltype(size<1>(s_rc))::value % 2 == 0, "columns come in pairs");
  constexpr int kThreadRows = decltype(size<0>(s_rc))::value;
  int q_doc[kThreadRows], q_grp[kThreadRows], qpos[kThreadRows];
  CUTE_UNROLL
  for (int r = 0; r < kThreadRows; ++r) {
    const int ii = get<0>(c_rc(r, 0));
    q_doc[r] = q_ids[ii];
    q_grp[r] = q_ids[kRows + ii];
    qpos[r] = qpos0 + ii;
  }
  // Columns outer, rows inner: only one pair's ids are live at a time.
  auto apply = [&](auto window_value) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); c += 2) {
      const int jj = get<1>(c_rc(0, c));  // even: the pair (jj, jj + 1) is 8-byte aligned
      const int2 k_doc = *reinterpret_cast<const int2*>(k_ids + jj);
      const int2 k_grp = *reinterpret_cast<const int2*>(k_ids + kCols + jj);
      CUTE_UNROLL
      for (int r = 0; r < kThreadRows; ++r) {
        if (!token_allowed(q_doc[r], q_grp[r], k_doc.x, k_grp.x, qpos[r], col0 + jj, window_value))
          s_rc(r, c) = -INFINITY;
        if (!token_allowed(q_doc[r], q_grp[r], k_doc.y, k_grp.y, qpos[r], col0 + jj + 1, window_value))
          s_rc(r, c + 1) = -INFINITY;
      }
    }
  };
  if (window <= 0) {
    apply(0);
  } else {
    apply(window);
  }
}

}  // namespace omni::sm90
