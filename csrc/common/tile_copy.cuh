// Predicated tile copies between global and shared memory. A tile is (CPY, CPY_ROWS, CPY_COLS) after
// partitioning, each CPY one 16-byte vector; only rows before `rows_valid` and columns before `cols_valid` (a call's
// head_dim, a multiple of 8, below the kernel's where host/dispatch.cuh rounds it up) touch global memory, so tails
// and narrower heads never read or write out of bounds.
#pragma once
#include <cute/tensor.hpp>

namespace omni {

using namespace cute;

// cp.async gmem -> smem of the first rows_valid rows and cols_valid columns of a kRows x kCols tile; the rest of
// smem is zero-filled. `coord` is the thread's partition of the tile's identity tensor (row, col). Whole tiles (the
// common case) take a path without predicates, which would otherwise stay live in registers.
template <int kRows, int kCols, class TiledCopy, class TS, class TD, class TC>
__forceinline__ __device__ void load_rows(const TiledCopy& copy_op, const TS& src, TD&& dst, const TC& coord,
                                          int rows_valid, int cols_valid) {
  if (rows_valid >= kRows && cols_valid >= kCols) {
    copy(copy_op, src, dst);
    return;
  }
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    const bool row_valid = get<0>(coord(0, m, 0)) < rows_valid;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(src); ++k) {
      copy(copy_op.with(row_valid && get<1>(coord(0, m, k)) < cols_valid), src(_, m, k), dst(_, m, k));
    }
  }
}

// smem -> gmem of the rows before rows_valid and the columns before cols_valid, 16 bytes per copy.
template <class TiledCopy, class TS, class TD, class TC>
__forceinline__ __device__ void store_rows(const TiledCopy& copy_op, const TS& src, TD&& dst, const TC& coord,
                                           int rows_valid, int cols_valid) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(src); ++m) {
    if (get<0>(coord(0, m, 0)) < rows_valid) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(src); ++k) {
        if (get<1>(coord(0, m, k)) < cols_valid) copy(copy_op, src(_, m, k), dst(_, m, k));
      }
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
