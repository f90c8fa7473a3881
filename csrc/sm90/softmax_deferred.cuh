// Online softmax whose output rescale is deferred: the scores of tile t are exponentiated while O still
// accumulates P(t-1) V(t-1) on the tensor cores, and O is multiplied by the factors once that GEMM is done.
#pragma once
#include "common/softmax.cuh"

namespace omni::sm90 {

template <int kRows>
struct DeferredSoftmax : OnlineSoftmax<kRows> {
  // OnlineSoftmax::update without touching O: s becomes exp2(s * scale_log2 - max) and `rescale` receives
  // what O, accumulated at the old running max, must be multiplied by.
  template <class TS>
  __forceinline__ __device__ void update_scores(TS& s, float scale_log2, float (&rescale)[kRows]) {
    static_assert(decltype(size<0>(s))::value == kRows, "row count mismatch");
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = this->row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = quad_allreduce(m, MaxOp{});
      // A row still without any allowed key keeps max -inf: subtract 0 so exp2(-inf) gives 0, not NaN.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      rescale[r] = fast_exp2(this->row_max[r] * scale_log2 - m_scaled);
      this->row_max[r] = m;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = fast_exp2(s(r, c) * scale_log2 - m_scaled);
        sum += s(r, c);
      }
      this->row_sum[r] = this->row_sum[r] * rescale[r] + sum;
    }
  }

  template <class TO>
  __forceinline__ __device__ static void rescale_output(TO& o, const float (&rescale)[kRows]) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= rescale[r];
    }
  }
};

}  // namespace omni::sm90
