// The additive score bias (OmniBias) and its gradient (OmniBiasGrad) inside the kernels: the view of one batch row
// and query head, read or accumulated at (query row, key). Callers add the bias to the raw scores of a tile before
// masking it (so that the mask still wins), in the raw scores' units: the logit is scale * s + bias, so s gains
// bias / scale (softcap and bias are not combined, host/params_check.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>

#include "omni_attention.h"

namespace omni {

using namespace cute;

// The bias of one (batch row, query head): value(i, j) of query row i and key j, both in range.
struct BiasView {
  const char* base;
  int64_t stride_q, stride_k;  // in bytes
  int32_t dtype;

  __forceinline__ __device__ float operator()(int i, int j) const {
    const char* at = base + i * stride_q + j * stride_k;
    switch (dtype) {
      case OMNI_FP16:
        return __half2float(*reinterpret_cast<const __half*>(at));
      case OMNI_BF16:
        return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(at));
      default:
        return *reinterpret_cast<const float*>(at);
    }
  }
};

__forceinline__ __device__ BiasView bias_view(const OmniBias& bias, int b, int h) {
  const int64_t size = bias.dtype == OMNI_FP32 ? 4 : 2;
  return {static_cast<const char*>(bias.ptr) + (b * bias.stride_b + h * bias.stride_h) * size, bias.stride_q * size,
          bias.stride_k * size, bias.dtype};
}

// Adds bias / scale to every score of a fragment whose pair is in range: s(i) at tile coordinates c(i) = (row,
// col), with rows from row0 and keys from col0 (kTransposed: c(i) = (key, row), the backward's S^T).
template <bool kTransposed = false, class TS, class TC>
__forceinline__ __device__ void add_bias(TS& s, const TC& c, const BiasView& bias, int row0, int col0, int q_len,
                                         int kv_len, float inv_scale) {
  CUTE_UNROLL
  for (int e = 0; e < size(s); ++e) {
    const int i = row0 + (kTransposed ? get<1>(c(e)) : get<0>(c(e)));
    const int j = col0 + (kTransposed ? get<0>(c(e)) : get<1>(c(e)));
    if (i < q_len && j < kv_len) s(e) += bias(i, j) * inv_scale;
  }
}

// Adds each ds(e), the gradient of the logit of the pair at c(e) (as in add_bias), to the bias's gradient.
template <bool kTransposed = false, class TS, class TC>
__forceinline__ __device__ void accumulate_bias_grad(const TS& ds, const TC& c, const OmniBiasGrad& grad, int b, int h,
                                                     int row0, int col0, int q_len, int kv_len) {
  float* base = grad.ptr + b * grad.stride_b + h * grad.stride_h;
  CUTE_UNROLL
  for (int e = 0; e < size(ds); ++e) {
    const int i = row0 + (kTransposed ? get<1>(c(e)) : get<0>(c(e)));
    const int j = col0 + (kTransposed ? get<0>(c(e)) : get<1>(c(e)));
    if (i < q_len && j < kv_len) atomicAdd(base + i * grad.stride_q + j * grad.stride_k, ds(e));
  }
}

}  // namespace omni
