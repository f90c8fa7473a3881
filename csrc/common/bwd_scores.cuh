// The element-wise math of the backward, shared by the sm_80 and sm_90a main kernels:
//   P  = exp2(t * mul - lse2)                 t = S, or t = tanh(scale * S / cap) under softcap
//   dS = P (dP - D)                           times 1 - t^2 under softcap
// with mul = log2(e) * (cap or scale). The factor `scale` of dS is applied to dK and dQ at the end.
#pragma once
#include "common/softmax.cuh"

namespace omni::bwd {

// log2(x) for x >= 0, denormals flushed (log2 of a denormal P gives -inf, so that entry's dS factor is 0).
__forceinline__ __device__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// dS of one score from its P, dP and its row's D and lse2. Under softcap, t is recovered from P as
// (log2 P + lse2) / mul, and 1 - t^2 is clamped so that masked entries (P = 0, t = -inf) give 0, not NaN.
template <bool kSoftcap>
__forceinline__ __device__ float score_grad(float p, float dp, float dsum, float lse2, float inv_mul) {
  const float ds = p * (dp - dsum);
  if constexpr (kSoftcap) {
    const float t = (fast_log2(p) + lse2) * inv_mul;
    return ds * fmaxf(1.f - t * t, 0.f);
  } else {
    return ds;
  }
}

}  // namespace omni::bwd
