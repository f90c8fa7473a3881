// Host helpers that turn run-time sizes and flags into template arguments.
#pragma once
#include <type_traits>

#include "host/head_dims.h"

namespace omni {

// Calls f(std::integral_constant<bool, cond>{}).
template <typename F>
int dispatch_bool(bool cond, F&& f) {
  return cond ? f(std::true_type{}) : f(std::false_type{});
}

// Calls f(std::integral_constant<int, size>{}) for a mask block size of 64 or 128 (checked by the caller).
template <typename F>
int dispatch_block(int size, F&& f) {
  return size == 64 ? f(std::integral_constant<int, 64>{}) : f(std::integral_constant<int, 128>{});
}

// The instantiated head dim whose kernels run calls of head dim `head_dim` (host/head_dims.h): the smallest one at or
// above it, whose loads read the columns past head_dim as zeros and whose stores write the first head_dim only; 0
// when head_dim is not a positive multiple of 8 (16-byte rows) up to the largest.
constexpr int kernel_head_dim(int head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0) return 0;
#define OMNI_AT_OR_ABOVE(D) if (head_dim <= D) return D;
  OMNI_FOR_EACH_HEAD_DIM(OMNI_AT_OR_ABOVE)
#undef OMNI_AT_OR_ABOVE
  return 0;
}

#define OMNI_IS_HEAD_DIM(D) kernel_dim == D ||
// Whether the sm_90a forward / backward kernels are instantiated for kernel_dim (a kernel_head_dim).
constexpr bool sm90_fwd_head_dim(int kernel_dim) { return OMNI_FOR_EACH_SM90_FWD_HEAD_DIM(OMNI_IS_HEAD_DIM) false; }
constexpr bool sm90_bwd_head_dim(int kernel_dim) { return OMNI_FOR_EACH_SM90_BWD_HEAD_DIM(OMNI_IS_HEAD_DIM) false; }
// Whether the split-KV decode kernels are instantiated for kernel_dim.
constexpr bool decode_head_dim(int kernel_dim) { return OMNI_FOR_EACH_DECODE_HEAD_DIM(OMNI_IS_HEAD_DIM) false; }
#undef OMNI_IS_HEAD_DIM

// Calls f(std::integral_constant<int, D>{}) for D = kernel_head_dim(head_dim), else (0) otherwise().
template <typename F, typename G>
auto dispatch_head_dim(int head_dim, F&& f, G&& otherwise) -> decltype(otherwise()) {
  switch (kernel_head_dim(head_dim)) {
#define OMNI_HEAD_DIM_CASE(D) \
  case D: return f(std::integral_constant<int, D>{});
    OMNI_FOR_EACH_HEAD_DIM(OMNI_HEAD_DIM_CASE)
#undef OMNI_HEAD_DIM_CASE
    default: return otherwise();
  }
}

}  // namespace omni
