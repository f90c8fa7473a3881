// Applies the element rule of mask_rule.cuh to one score tile held in registers. Scores s and their in-tile
// (row, col) coordinates c come as the thread's accumulator fragments (same layout). FULL tiles call none of
// these. PARTIAL tiles are evaluated into one bit per fragment element *before* the Q.K^T GEMM (while the
// score accumulators are not yet live, so the rule's loads cost no spills) and applied after it.
#pragma once
#include <cute/tensor.hpp>

#include <cmath>

#include "common/mask_rule.cuh"

namespace omni {

using namespace cute;

// One bit per element of a kElems-element fragment.
template <int kElems>
struct FragmentBits {
  static_assert(kElems % 32 == 0, "fragment size must be a multiple of 32");
  uint32_t word[kElems / 32];

  template <class Allowed>
  __forceinline__ __device__ void evaluate(Allowed allowed) {
    CUTE_UNROLL
    for (int w = 0; w < kElems / 32; ++w) word[w] = word_of(allowed, w);
  }

  // Clears the bits of the elements that `allowed` refuses.
  template <class Allowed>
  __forceinline__ __device__ void keep_only(Allowed allowed) {
    CUTE_UNROLL
    for (int w = 0; w < kElems / 32; ++w) word[w] &= word_of(allowed, w);
  }

  template <class Allowed>
  __forceinline__ __device__ static uint32_t word_of(Allowed allowed, int w) {
    uint32_t bits = 0;
    CUTE_UNROLL
    for (int b = 0; b < 32; ++b) bits |= uint32_t(allowed(w * 32 + b)) << b;
    return bits;
  }

  template <class TS>
  __forceinline__ __device__ void apply(TS& s) const {
    CUTE_UNROLL
    for (int i = 0; i < kElems; ++i) {
      if (!((word[i / 32] >> (i % 32)) & 1u)) s(i) = -INFINITY;
    }
  }
};

// Columns at or past col_limit (tile-local) hold no key.
template <class TS, class TC>
__forceinline__ __device__ void mask_col_limit(TS& s, const TC& c, int col_limit) {
  CUTE_UNROLL
  for (int i = 0; i < size(s); ++i) {
    if (get<1>(c(i)) >= col_limit) s(i) = -INFINITY;
  }
}

// CAUSAL: qpos0 is the absolute position of the tile's row 0, col0 its first key.
template <class TS, class TC>
__forceinline__ __device__ void mask_causal(TS& s, const TC& c, int qpos0, int col0) {
  CUTE_UNROLL
  for (int i = 0; i < size(s); ++i) {
    if (!causal_allowed(qpos0 + get<0>(c(i)), col0 + get<1>(c(i)))) s(i) = -INFINITY;
  }
}

// PARTIAL by the token rule of mask m: q_ids / k_ids are the staged [doc, grp] ids of the tile's rows / columns.
// Without a window (window <= 0) the rule is instantiated with the constant 0, which drops its window test. Where the
// window cuts group pairs too (m.window_covers_groups), a second pass clears every pair outside it (mask_rule.cuh's
// token_allowed with covers_groups; the choice made per element instead spills more in the 128 x 128 forward).
template <int kRowsTile, int kColsTile, class Bits, class TC>
__forceinline__ __device__ void token_bits(Bits& bits, const TC& c, const int* q_ids, const int* k_ids, int qpos0,
                                           int col0, const OmniMask& m) {
  auto evaluate = [&](auto window_value) {
    bits.evaluate([&](int i) {
      const int ii = get<0>(c(i));
      const int jj = get<1>(c(i));
      return token_allowed(q_ids[ii], q_ids[kRowsTile + ii], k_ids[jj], k_ids[kColsTile + jj], qpos0 + ii, col0 + jj,
                           window_value);
    });
  };
  if (m.window <= 0) {
    evaluate(0);
    return;
  }
  evaluate(m.window);
  if (m.window_covers_groups) {
    bits.keep_only([&](int i) { return in_window(qpos0 + get<0>(c(i)), col0 + get<1>(c(i)), m.window); });
  }
}

// PARTIAL from the pool: whether element i of a fragment (at c(i)) is allowed. `staged` is the tile's pool rows
// as a one-entry pool (tile_aux.cuh); columns at or past col_limit hold no key. Every staged word is in bounds,
// so the bit is read unconditionally (`&`, not `&&`): a branch per element would cost more than the load.
template <class TC>
__forceinline__ __device__ bool pool_element_allowed(const TC& c, int i, const OmniMask& staged, int col_limit) {
  const int jj = get<1>(c(i));
  return pool_allowed(staged, 0, get<0>(c(i)), jj) & (jj < col_limit);
}

template <class Bits, class TC>
__forceinline__ __device__ void pool_bits(Bits& bits, const TC& c, const OmniMask& staged, int col_limit) {
  bits.evaluate([&](int i) { return pool_element_allowed(c, i, staged, col_limit); });
}

// The same applied straight to the scores, where no accumulator is saved by evaluating first.
template <class TS, class TC>
__forceinline__ __device__ void mask_pool(TS& s, const TC& c, const OmniMask& staged, int col_limit) {
  CUTE_UNROLL
  for (int i = 0; i < size(s); ++i) {
    if (!pool_element_allowed(c, i, staged, col_limit)) s(i) = -INFINITY;
  }
}

}  // namespace omni
