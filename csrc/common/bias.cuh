// The additive score bias (OmniBias) and its gradient (OmniBiasGrad) inside the kernels: the view of one batch row
// and query head, read or written at (query row, key). Callers add the bias to the raw scores of a tile before
// masking it (so that the mask still wins), in the raw scores' units: the logit is scale * s + bias, so s gains
// bias / scale (softcap and bias are not combined, host/params_check.cu). The accumulator fragments of both kernel
// families hold neighbouring columns in neighbouring elements; where those are neighbouring keys of a bias whose
// keys are contiguous (OmniBias::paired), the two are read as one vector.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>

#include "omni_attention.h"

namespace omni {

using namespace cute;

// Byte offsets and element type of one (batch row, query head) of a bias or its gradient.
struct ScoreView {
  char* base;
  int64_t stride_q, stride_k;  // in bytes
  int32_t dtype;

  __forceinline__ __device__ char* at(int i, int j) const { return base + i * stride_q + j * stride_k; }
  // The same view with (i, j) counted from (row0, col0).
  __forceinline__ __device__ ScoreView from(int row0, int col0) const {
    return {at(row0, col0), stride_q, stride_k, dtype};
  }
};

__forceinline__ __device__ int64_t dtype_bytes(int32_t dtype) { return dtype == OMNI_FP32 ? 4 : 2; }

template <class Params>
__forceinline__ __device__ ScoreView score_view(const Params& t, const void* ptr, int32_t dtype, int b, int h) {
  const int64_t size = dtype_bytes(dtype);
  return {static_cast<char*>(const_cast<void*>(ptr)) + (b * t.stride_b + h * t.stride_h) * size, t.stride_q * size,
          t.stride_k * size, dtype};
}

__forceinline__ __device__ float2 load_pair(const char* at, int32_t dtype) {
  switch (dtype) {
    case OMNI_FP16:
      return __half22float2(*reinterpret_cast<const __half2*>(at));
    case OMNI_BF16:
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(at));
    default:
      return *reinterpret_cast<const float2*>(at);
  }
}

__forceinline__ __device__ float load_one(const char* at, int32_t dtype) {
  switch (dtype) {
    case OMNI_FP16:
      return __half2float(*reinterpret_cast<const __half*>(at));
    case OMNI_BF16:
      return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(at));
    default:
      return *reinterpret_cast<const float*>(at);
  }
}

__forceinline__ __device__ void store_one(char* at, int32_t dtype, float x) {
  switch (dtype) {
    case OMNI_FP16:
      *reinterpret_cast<__half*>(at) = __float2half_rn(x);
      break;
    case OMNI_BF16:
      *reinterpret_cast<__nv_bfloat16*>(at) = __float2bfloat16_rn(x);
      break;
    default:
      *reinterpret_cast<float*>(at) = x;
  }
}

// The tile's (query row, key) of fragment element e: c(e) = (row, col) (kTransposed: c(e) = (key, row), the sm_90a
// backward's S^T).
template <bool kTransposed, class TC>
__forceinline__ __device__ void pair_coords(const TC& c, int e, int& i, int& j) {
  i = kTransposed ? get<1>(c(e)) : get<0>(c(e));
  j = kTransposed ? get<0>(c(e)) : get<1>(c(e));
}

// Adds bias / scale to every score of a fragment whose pair is in range: view holds the tile's bias from its
// first (row, key), of which `rows` x `cols` are in the call (coordinates as in pair_coords). paired: the view's
// keys are contiguous and 4-byte aligned in pairs (OmniBias::paired, or a staged tile).
template <bool kTransposed = false, class TS, class TC>
__forceinline__ __device__ void add_bias_tile(TS& s, const TC& c, const ScoreView& view, bool paired, int rows,
                                              int cols, float inv_scale) {
  static_assert(decltype(size(s))::value % 2 == 0, "fragments hold column pairs");
  CUTE_UNROLL
  for (int e = 0; e < size(s); e += 2) {
    int i, j, i1, j1;
    pair_coords<kTransposed>(c, e, i, j);
    pair_coords<kTransposed>(c, e + 1, i1, j1);
    if (!kTransposed && paired && i1 == i && j1 == j + 1 && i < rows && j1 < cols) {
      const float2 x = load_pair(view.at(i, j), view.dtype);
      s(e) += x.x * inv_scale;
      s(e + 1) += x.y * inv_scale;
    } else {
      if (i < rows && j < cols) s(e) += load_one(view.at(i, j), view.dtype) * inv_scale;
      if (i1 < rows && j1 < cols) s(e + 1) += load_one(view.at(i1, j1), view.dtype) * inv_scale;
    }
  }
}

// add_bias_tile reading the call's bias in global memory, for the tile at (row0, col0).
template <bool kTransposed = false, class TS, class TC>
__forceinline__ __device__ void add_bias(TS& s, const TC& c, const OmniBias& bias, int b, int h, int row0, int col0,
                                         int q_len, int kv_len, float inv_scale) {
  const ScoreView view = score_view(bias, bias.ptr, bias.dtype, b, h).from(row0, col0);
  add_bias_tile<kTransposed>(s, c, view, bias.paired, q_len - row0, kv_len - col0, inv_scale);
}

// Whether the bias's tiles can be staged in shared memory by 16-byte copies (stage_bias_tile): 2-byte elements,
// keys contiguous, every other stride and the pointer 16-byte aligned.
__forceinline__ __device__ bool bias_stageable(const OmniBias& bias) {
  const int64_t strides = bias.stride_b | bias.stride_h | bias.stride_q;
  return bias.ptr != nullptr && bias.dtype != OMNI_FP32 && bias.stride_k == 1 && strides % 8 == 0 &&
         reinterpret_cast<uintptr_t>(bias.ptr) % 16 == 0;
}

// Copies the bias of a kRows x kCols tile (rows from row0, keys from col0) into smem rows of kPitch elements by
// cp.async, 16 bytes at a time, zero-filling what lies past q_len or kv_len; the caller fences and waits. The
// pitch (kCols + 8) spreads the rows over the banks for the transposed reads of the sm_90a backward.
template <int kRows, int kCols, int kPitch, int kThreads>
__forceinline__ __device__ void stage_bias_tile(char* smem, const OmniBias& bias, int b, int h, int row0, int col0,
                                                int q_len, int kv_len, int tid) {
  static_assert(kCols % 8 == 0 && kPitch % 8 == 0, "rows of 16-byte chunks");
  constexpr int kChunksPerRow = kCols / 8;
  const ScoreView view = score_view(bias, bias.ptr, bias.dtype, b, h).from(row0, col0);
#pragma unroll 1  // a loop: the producer warp has few registers
  for (int idx = tid; idx < kRows * kChunksPerRow; idx += kThreads) {
    const int i = idx / kChunksPerRow;
    const int j = idx % kChunksPerRow * 8;
    const int valid = i < q_len - row0 ? max(0, min(8, kv_len - col0 - j)) : 0;
    const char* src = valid > 0 ? view.at(i, j) : static_cast<const char*>(bias.ptr);
    const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem + (i * kPitch + j) * 2));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid * 2));
  }
}

// Writes each ds(e), the gradient of the logit of the pair at c(e) (coordinates as in pair_coords), to the bias's
// gradient: stored where no other pair shares its element, else added with a float32 atomic.
template <bool kTransposed = false, class TS, class TC>
__forceinline__ __device__ void write_bias_grad(const TS& ds, const TC& c, const OmniBiasGrad& grad, int b, int h,
                                                int row0, int col0, int q_len, int kv_len) {
  const ScoreView view = score_view(grad, grad.ptr, grad.dtype, b, h).from(row0, col0);
  CUTE_UNROLL
  for (int e = 0; e < size(ds); ++e) {
    int i, j;
    pair_coords<kTransposed>(c, e, i, j);
    if (i >= q_len - row0 || j >= kv_len - col0) continue;
    if (grad.exclusive) {
      store_one(view.at(i, j), view.dtype, ds(e));
    } else {
      atomicAdd(reinterpret_cast<float*>(view.at(i, j)), ds(e));
    }
  }
}

}  // namespace omni
