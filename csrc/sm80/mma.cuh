// Warp-level GEMMs on register fragments fed by ldmatrix, with the next k-slice's ldmatrix issued
// before the current slice's mma.sync so shared-memory latency hides behind the tensor cores.
#pragma once
#include <cute/tensor.hpp>

namespace omni {

using namespace cute;

// The registers of fragment t as the destination (or source) layout of copy_op's per-thread copies.
template <class TiledCopy, class T>
__forceinline__ __device__ auto retile(const TiledCopy&, T& t) {
  return make_tensor(t.data(), TiledCopy::retile(t.layout()));
}

// acc += A . B^T with both operands in smem. tCrA/tCrB: MMA fragments (MMA, MMA_M|N, MMA_K);
// tCsA/tCsB: the ldmatrix partitions of smem; copy_a/copy_b: the ldmatrix TiledCopy of each operand.
template <class Acc, class TA, class TB, class TsA, class TsB, class Mma, class CopyA, class CopyB>
__forceinline__ __device__ void gemm_ss(Acc& acc, TA& tCrA, TB& tCrB, const TsA& tCsA, const TsB& tCsB, const Mma& mma,
                                        const CopyA& copy_a, const CopyB& copy_b) {
  auto tCrA_view = retile(copy_a, tCrA);
  auto tCrB_view = retile(copy_b, tCrB);
  copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k + 1 < size<2>(tCrA)) {
      copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    gemm(mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A . B^T with A already in registers (e.g. P) and B in smem.
template <class Acc, class TA, class TB, class TsB, class Mma, class CopyB>
__forceinline__ __device__ void gemm_rs(Acc& acc, const TA& tCrA, TB& tCrB, const TsB& tCsB, const Mma& mma,
                                        const CopyB& copy_b) {
  auto tCrB_view = retile(copy_b, tCrB);
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < size<2>(tCrA); ++k) {
    if (k + 1 < size<2>(tCrA)) copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    gemm(mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

}  // namespace omni
