// Row-predicated tile copies between global and shared memory. A tile is (CPY, CPY_ROWS, CPY_COLS) after
// partitioning; only rows before `rows_valid` touch global memory, so tails never read or write out of bounds.
#pragma once
#include <cute/tensor.hpp>

namespace omni {

using namespace cute;

// cp.async gmem -> smem of the first rows_valid rows of a kRows-row tile; the other rows of smem are
// zero-filled. `coord` is the thread's partition of the tile's identity tensor (row, col). Whole tiles (the
// common case) take a path without predicates, which would otherwise stay live in registers.
template <int kRows, class TiledCopy, class TS, class TD, class TC>
__forceinline__ __device__ void load_rows(const TiledCopy& copy_op, const TS& src, TD&& dst, const TC& coord,
                                          int rows_valid) {
  if (rows_valid >= kRows) {
    copy(copy_op, src, dst);
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const bool valid = get<0>(coord(0, m, 0)) < rows_valid;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) copy(copy_op.with(valid), src(_, m, k), dst(_, m, k));
  }
}

// smem -> gmem of the rows before rows_valid, 16 bytes per copy.
template <class TiledCopy, class TS, class TD, class TC>
__forceinline__ __device__ void store_rows(const TiledCopy& copy_op, const TS& src, TD&& dst, const TC& coord,
                                           int rows_valid) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coord(0, m, 0)) < rows_valid) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) copy(copy_op, src(_, m, k), dst(_, m, k));
    }
  }
}

// Threads per row when a tile of kCols columns is stored as 16-byte vectors: the largest power of two, up to
// kMaxPerRow, that divides the row's vectors (8 at head dim 64, 4 at 96).
template <int kCols, int kMaxPerRow>
constexpr int row_vector_threads() {
  int n = kMaxPerRow;
  while ((kCols / 8) % n != 0) n /= 2;
  return n;
}

}  // namespace omni
