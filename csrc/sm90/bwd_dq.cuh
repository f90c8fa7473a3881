// The sm_90a backward's dQ accumulator. Each 64-row tile of the workspace's dq_accum ([B, Hq, q_pad, D] fp32,
// kBlockM * D contiguous floats per tile) is kept in the order the dQ threads (Traits::kDqThreads: both consumer
// warpgroups, or warpgroup 0 alone with kDqSplitKeys) hold their dQ fragments, not row-major: float4 number j
// of dQ thread c sits at slot j * kDqThreads + c. The main kernel then stages a tile's dQ in shared memory with
// conflict-free 16-byte stores and adds it to the workspace with two bulk reductions, one per half;
// bwd_convert_dq_kernel below maps slots back to (row, col) when it writes dq.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

#include "common/bwd_workspace.cuh"
#include "omni_attention.h"

namespace omni::sm90 {

using namespace cute;

// dQ values of one dQ thread, and their 16-byte vectors.
template <class Traits>
struct DqSlots {
  static constexpr int kValues = Traits::kDqFloats / Traits::kDqThreads;
  static constexpr int kVecs = kValues / 4;
  static_assert(kValues % 4 == 0, "whole float4 vectors per thread");
  __device__ static int slot(int vec, int tid) { return (vec * Traits::kDqThreads + tid) * 4; }
};

// dQ thread tid's fragment (fp32 registers, from Traits::TiledMmaDQ) -> its slots of the tile, whose first
// kDqHalfFloats floats are at `lo` and the rest at `hi` (bwd_traits.cuh). kAccumulate: acc += the slots first
// (warpgroup 1's partial sum, with kDqSplitKeys), so that the slots end up with the sum.
template <class Traits, bool kAccumulate = false, class Acc>
__forceinline__ __device__ void store_dq_slots(Acc& acc, float* lo, float* hi, int tid) {
  using Slots = DqSlots<Traits>;
  static_assert(decltype(size(acc))::value == Slots::kValues, "one dQ fragment per dQ thread");
  static_assert(Slots::kVecs % 2 == 0, "each half holds whole vectors of every thread");
  CUTE_UNROLL
  for (int j = 0; j < Slots::kVecs; ++j) {
    float4* slot =
        reinterpret_cast<float4*>((j < Slots::kVecs / 2 ? lo : hi - Traits::kDqHalfFloats) + Slots::slot(j, tid));
    if constexpr (kAccumulate) {
      const float4 other = *slot;
      acc(4 * j) += other.x;
      acc(4 * j + 1) += other.y;
      acc(4 * j + 2) += other.z;
      acc(4 * j + 3) += other.w;
    }
    *slot = make_float4(acc(4 * j), acc(4 * j + 1), acc(4 * j + 2), acc(4 * j + 3));
  }
}

// grid (B * Hq, q_pad / kBlockM), kDqThreads threads: dq[b, h, i, :] = Element(scale * dQ) for i < q_len.
// Thread c converts the values dQ thread c held in the main kernel (their (row, col) from the same partition
// of the same tiled MMA) into a row-major smem tile, whose rows are then stored as 16-byte vectors: a fragment's
// pairs would write 16 bytes into each of 8 rows per warp store, half of every 32-byte sector.
template <class Traits>
__global__ void __launch_bounds__(Traits::kDqThreads)
    bwd_convert_dq_kernel(const __grid_constant__ OmniBwdParams p, const bwd::Workspace ws) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  using Slots = DqSlots<Traits>;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kRowStride = kHeadDim + 8;  // 16 bytes of padding: the 8 rows of one fragment store hit distinct banks
  constexpr int kRowVecs = kHeadDim / 8;  // 16-byte vectors per row
  __shared__ __align__(16) Element rows_s[kBlockM * kRowStride];
  const int ctid = threadIdx.x;
  const int bh = blockIdx.x;
  const int b = bh / p.fwd.heads_q, h = bh % p.fwd.heads_q;
  const int m0 = blockIdx.y * kBlockM;
  const float* tile = ws.dq_accum + (int64_t(bh) * ws.q_pad + m0) * kHeadDim;
  const Tensor c = typename Traits::TiledMmaDQ{}.get_thread_slice(ctid).partition_C(
      make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  CUTE_UNROLL
  for (int j = 0; j < Slots::kVecs; ++j) {
    const float4 v = *reinterpret_cast<const float4*>(tile + Slots::slot(j, ctid));
    const float pair[2][2] = {{v.x, v.y}, {v.z, v.w}};
    CUTE_UNROLL
    for (int e = 0; e < 2; ++e) {  // values 4j + 2e, 4j + 2e + 1: neighbouring columns of one row
      cutlass::Array<float, 2> scaled;
      scaled[0] = pair[e][0] * p.fwd.scale;
      scaled[1] = pair[e][1] * p.fwd.scale;
      *reinterpret_cast<cutlass::Array<Element, 2>*>(rows_s + get<0>(c(4 * j + 2 * e)) * kRowStride +
                                                     get<1>(c(4 * j + 2 * e))) =
          cutlass::NumericArrayConverter<Element, float, 2>{}(scaled);
    }
  }
  __syncthreads();
  Element* dq = static_cast<Element*>(p.dq.ptr) + b * p.dq.stride_b + h * p.dq.stride_h;
  CUTE_UNROLL
  for (int i = ctid; i < kBlockM * kRowVecs; i += Traits::kDqThreads) {
    const int row = i / kRowVecs, vec = i % kRowVecs;
    if (m0 + row < p.fwd.q_len && vec * 8 < p.fwd.head_dim) {  // the call's columns only
      *reinterpret_cast<uint4*>(dq + (m0 + row) * p.dq.stride_s + vec * 8) =
          *reinterpret_cast<const uint4*>(rows_s + row * kRowStride + vec * 8);
    }
  }
#endif
}

}  // namespace omni::sm90
