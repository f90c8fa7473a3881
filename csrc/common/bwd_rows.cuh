// The two row-wise kernels around the backward main kernel: the preprocess (D = rowsum(dO * O), lse in
// base 2, dQ accumulator zeroed) and the conversion of the fp32 dQ accumulator to the output dtype.
// Both: one CTA of 256 threads per (64-row tile, batch * query head); each row is read as 16-byte vectors
// by kHeadDim / 8 consecutive lanes (of a power-of-two group of lanes, whose last ones idle at head dim 96), or by
// a whole warp, a vector per lane per 256 columns, above head dim 256. Of a call's head_dim below kHeadDim, the
// columns past it are neither read nor written (zeros to the dot product).
// Both kernel families launch the preprocess (launch_preprocess); the conversion is sm_80's (the sm_90a
// accumulator has its own layout, sm90/bwd_dq.cuh).
#pragma once
#include <cuda_runtime.h>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

#include "common/bwd_workspace.cuh"
#include "host/status.cuh"

namespace omni::bwd {

constexpr int kRowThreads = 256;

template <int kHeadDim>
struct RowLanes {
  static constexpr int kVec = 8;  // elements per 16-byte vector of fp16 / bf16
  static constexpr int kVecs = kHeadDim / kVec;
  static constexpr int kPerRow = kVecs <= 8 ? 8 : kVecs <= 16 ? 16 : 32;  // lanes sharing a row
  static constexpr int kVecsPerLane = (kVecs + kPerRow - 1) / kPerRow;     // vectors of a row each lane takes
  static constexpr int kRowsPerPass = kRowThreads / kPerRow;               // rows a CTA covers per pass
  static_assert(kHeadDim % kVec == 0 && kVecs % kVecsPerLane == 0, "a row's lanes stay inside one warp");
  // The first column of this thread's vector v; kHeadDim or more for the idle lanes.
  __device__ static int col(int v = 0) { return (threadIdx.x % kPerRow + v * kPerRow) * kVec; }
};

// grid (B * Hq, q_pad / 64): dsum[row] = sum_d dO * O (0 past q_len); lse2[row] = lse * log2(e), +inf
// for lse = -inf and past q_len (so that P = 0 there); dq_accum[row, :] = 0; the tile's dq_turns = 0; with dsinks, the
// sink's gradient of the tile's rows, -sum exp(sink - lse) * dsum, summed in shared memory and added to dsinks[h] once
// per CTA.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kRowThreads)
    bwd_preprocess_kernel(const __grid_constant__ OmniBwdParams p, const Workspace ws) {
  using Lanes = RowLanes<kHeadDim>;
  using Vec = cutlass::Array<Element, Lanes::kVec>;
  const OmniFwdParams& f = p.fwd;
  const int bh = blockIdx.x;
  const int b = bh / f.heads_q, h = bh % f.heads_q;
  cutlass::NumericArrayConverter<float, Element, Lanes::kVec> to_float;
  __shared__ float dsink;
  if (threadIdx.x == 0) ws.dq_turns[static_cast<int64_t>(bh) * (ws.q_pad / kRowTile) + blockIdx.y] = 0;
  if (p.dsinks != nullptr) {
    if (threadIdx.x == 0) dsink = 0.f;
    __syncthreads();
  }
  for (int r = threadIdx.x / Lanes::kPerRow; r < kRowTile; r += Lanes::kRowsPerPass) {
    const int i = blockIdx.y * kRowTile + r;
    float dot = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < Lanes::kVecsPerLane; ++v) {
      const int col = Lanes::col(v);
      if (i < f.q_len && col < f.head_dim) {
        const auto dout =
            to_float(*reinterpret_cast<const Vec*>(static_cast<const Element*>(p.dout.ptr) + b * p.dout.stride_b +
                                                   h * p.dout.stride_h + i * p.dout.stride_s + col));
        const auto out =
            to_float(*reinterpret_cast<const Vec*>(static_cast<const Element*>(f.out.ptr) + b * f.out.stride_b +
                                                   h * f.out.stride_h + i * f.out.stride_s + col));
        CUTLASS_PRAGMA_UNROLL
        for (int e = 0; e < Lanes::kVec; ++e) dot += dout[e] * out[e];
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int lane = Lanes::kPerRow / 2; lane > 0; lane /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, lane);
    const int64_t row = static_cast<int64_t>(bh) * ws.q_pad + i;
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < Lanes::kVecsPerLane; ++v) {
      if (Lanes::col(v) < kHeadDim) {
        float4* acc = reinterpret_cast<float4*>(ws.dq_accum + row * kHeadDim + Lanes::col(v));
        acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    if (Lanes::col() == 0) {
      const float lse = i < f.q_len ? f.lse[static_cast<int64_t>(bh) * f.q_len + i] : -INFINITY;
      ws.dsum[row] = dot;
      ws.lse2[row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      if (p.dsinks != nullptr && lse != -INFINITY) atomicAdd(&dsink, -expf(f.sinks[h] - lse) * dot);
    }
  }
  if (p.dsinks != nullptr) {
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(p.dsinks + h, dsink);
  }
}

// grid (B * Hq, q_pad / 64): dq[b, h, i, :head_dim] = Element(scale * dq_accum[row, :head_dim]) for i < q_len,
// with the strides of dq.
template <typename Element, int kHeadDim>
__global__ void __launch_bounds__(kRowThreads)
    bwd_convert_dq_kernel(const __grid_constant__ OmniBwdParams p, const Workspace ws) {
  using Lanes = RowLanes<kHeadDim>;
  const int bh = blockIdx.x;
  const int b = bh / p.fwd.heads_q, h = bh % p.fwd.heads_q;
  if (Lanes::col() >= p.fwd.head_dim) return;
  cutlass::NumericArrayConverter<Element, float, Lanes::kVec> to_element;
  for (int r = threadIdx.x / Lanes::kPerRow; r < kRowTile; r += Lanes::kRowsPerPass) {
    const int i = blockIdx.y * kRowTile + r;
    if (i >= p.fwd.q_len) break;
    const int64_t row = static_cast<int64_t>(bh) * ws.q_pad + i;
    CUTLASS_PRAGMA_UNROLL
    for (int v = 0; v < Lanes::kVecsPerLane; ++v) {
      const int col = Lanes::col(v);
      if (col >= p.fwd.head_dim) break;
      cutlass::Array<float, Lanes::kVec> acc =
          *reinterpret_cast<const cutlass::Array<float, Lanes::kVec>*>(ws.dq_accum + row * kHeadDim + col);
      CUTLASS_PRAGMA_UNROLL
      for (int e = 0; e < Lanes::kVec; ++e) acc[e] *= p.fwd.scale;
      *reinterpret_cast<cutlass::Array<Element, Lanes::kVec>*>(static_cast<Element*>(p.dq.ptr) + b * p.dq.stride_b +
                                                               h * p.dq.stride_h + i * p.dq.stride_s + col) =
          to_element(acc);
    }
  }
}

// The grid of both row kernels: (B * Hq, q_pad / 64); empty when q_len is 0.
inline dim3 row_grid(const OmniFwdParams& f, const Workspace& ws) {
  return dim3(f.batch * f.heads_q, static_cast<unsigned>(ws.q_pad / kRowTile));
}

// Launches the preprocess on p.fwd.stream (nothing for an empty grid).
template <typename Element, int kHeadDim>
int launch_preprocess(const OmniBwdParams& p, const Workspace& ws) {
  const dim3 grid = row_grid(p.fwd, ws);
  if (grid.x == 0 || grid.y == 0) return OMNI_OK;
  bwd_preprocess_kernel<Element, kHeadDim><<<grid, kRowThreads, 0, static_cast<cudaStream_t>(p.fwd.stream)>>>(p, ws);
  return check_cuda(cudaGetLastError(), "backward preprocess launch");
}

}  // namespace omni::bwd
