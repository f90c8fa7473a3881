// Online softmax over the key tiles of one query tile (FlashAttention-2 style), in base 2 with the
// softmax scale folded into one FFMA per element. Rows with no allowed key end with out = 0, lse = -inf (or, with
// sinks, the row's sink logit).
#pragma once
#include <cute/tensor.hpp>

#include <cmath>

#include "common/fragment.cuh"
#include "omni_attention.h"

namespace omni {

using namespace cute;

// log2(e) times the factor that multiplies the (capped) score inside the exponent: softcap with a cap, else
// scale. Every forward and backward kernel takes it from here, so the backward's P matches the forward's LSE.
__forceinline__ __device__ float softmax_scale_log2(const OmniFwdParams& p, bool softcap) {
  return (softcap ? p.softcap : p.scale) * float(M_LOG2E);
}

// The sink of query head h in the forward's log2 units (-inf where the call has none); see OmniFwdParams::sinks.
__forceinline__ __device__ float sink_log2(const OmniFwdParams& p, int h) {
  return p.sinks == nullptr ? -INFINITY : p.sinks[h] * float(M_LOG2E);
}

// How a row is normalised: out *= inv, and its natural-log LSE. max_log2: the running max of its scores in log2
// units, sum: the sum of exp2(score - max_log2) (0: no allowed key, max_log2 then ignored), sink_log2: the row's
// sink logit in log2 units (-inf: none), which joins the denominator and takes no value. A row with neither an
// allowed key nor a sink gets inv 0 and lse -inf; one with only a sink inv 0 and the sink's logit.
struct RowNorm {
  float inv, lse;
};

__forceinline__ __device__ RowNorm normalise_row(float max_log2, float sum, float sink_log2) {
  const float row_max = sum == 0.f ? -INFINITY : max_log2;
  const float top = fmaxf(row_max, sink_log2);  // the denominator's largest term
  if (top == -INFINITY) return {0.f, -INFINITY};
  const float keep = exp2f(row_max - top);  // 1 without a sink, 0 without a key
  const float total = sum * keep + exp2f(sink_log2 - top);
  return {keep / total, top * float(M_LN2) + logf(total)};
}

__forceinline__ __device__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__forceinline__ __device__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A row of an m16n8 accumulator is spread over the 4 threads of a quad.
template <typename Op>
__forceinline__ __device__ float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return op(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// All 32 lanes of a warp.
template <typename Op>
__forceinline__ __device__ float warp_allreduce(float x, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// s <- tanh(s * scale / softcap) on every element; the exponent then uses softcap * log2(e).
template <class Tensor>
__forceinline__ __device__ void apply_softcap(Tensor& s, float pre_scale) {
  CUTE_UNROLL
  for (int i = 0; i < size(s); ++i) s(i) = fast_tanh(s(i) * pre_scale);
}

// Running max and sum of kRows rows (this thread's share of each row's columns).
template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];
  float row_sum[kRows];

  __device__ OnlineSoftmax() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // s: scores of one tile as (rows, cols) with -inf where masked, overwritten by exp2(s*scale_log2 - max);
  // o: the output accumulator as (rows, cols), rescaled to the new running max.
  template <class TS, class TO>
  __forceinline__ __device__ void update(TS& s, TO& o, float scale_log2) {
    static_assert(decltype(size<0>(s))::value == kRows, "row count mismatch");
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float m = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) m = fmaxf(m, s(r, c));
      m = quad_allreduce(m, MaxOp{});
      // A row still without any allowed key keeps max -inf: subtract 0 so exp2(-inf) gives 0, not NaN.
      const float m_scaled = m == -INFINITY ? 0.f : m * scale_log2;
      const float rescale = fast_exp2(row_max[r] * scale_log2 - m_scaled);
      row_max[r] = m;
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = fast_exp2(s(r, c) * scale_log2 - m_scaled);
        sum += s(r, c);
      }
      row_sum[r] = row_sum[r] * rescale + sum;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= rescale;
    }
  }

  // Normalises o by the row sums and returns each row's natural-log LSE (normalise_row; sink_log2: the rows' sink
  // logit times log2(e), -inf for none). A row with no allowed key keeps o exactly 0.
  template <class TO>
  __forceinline__ __device__ void finalize(TO& o, float scale_log2, float (&lse)[kRows], float sink_log2 = -INFINITY) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const RowNorm norm = normalise_row(row_max[r] * scale_log2, quad_allreduce(row_sum[r], SumOp{}), sink_log2);
      lse[r] = norm.lse;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); ++c) o(r, c) *= norm.inv;
    }
  }
};

// Writes the lse of each row of a thread's accumulator fragment to lse_row[row] for rows before rows_valid.
// c_rc: the fragment's (row, col) coordinates as (rows, cols); the quad's first thread (the one holding
// column 0) writes for the quad.
template <int kRows, class TC>
__forceinline__ __device__ void store_lse(const TC& c_rc, const float (&lse)[kRows], float* lse_row, int rows_valid) {
  if (get<1>(c_rc(0, 0)) == 0) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(c_rc(r, 0));
      if (row < rows_valid) lse_row[row] = lse[r];
    }
  }
}

}  // namespace omni
