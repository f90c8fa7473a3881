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

#define OMNI_IS_HEAD_DIM(D) head_dim == D ||
// Whether head_dim has kernel instantiations (host/head_dims.h): the sm_80 ones, which take every head dim listed.
constexpr bool instantiated_head_dim(int head_dim) { return OMNI_FOR_EACH_HEAD_DIM(OMNI_IS_HEAD_DIM) false; }
// Whether the sm_90a forward / backward kernels are instantiated for head_dim.
constexpr bool sm90_fwd_head_dim(int head_dim) { return OMNI_FOR_EACH_SM90_FWD_HEAD_DIM(OMNI_IS_HEAD_DIM) false; }
constexpr bool sm90_bwd_head_dim(int head_dim) { return OMNI_FOR_EACH_SM90_BWD_HEAD_DIM(OMNI_IS_HEAD_DIM) false; }
// Whether the split-KV decode kernels are instantiated for head_dim.
constexpr bool decode_head_dim(int head_dim) { return OMNI_FOR_EACH_DECODE_HEAD_DIM(OMNI_IS_HEAD_DIM) false; }
#undef OMNI_IS_HEAD_DIM

// Calls f(std::integral_constant<int, D>{}) for the instantiated head dim D equal to head_dim, else otherwise().
template <typename F, typename G>
auto dispatch_head_dim(int head_dim, F&& f, G&& otherwise) -> decltype(otherwise()) {
  switch (head_dim) {
#define OMNI_HEAD_DIM_CASE(D) \
  case D: return f(std::integral_constant<int, D>{});
    OMNI_FOR_EACH_HEAD_DIM(OMNI_HEAD_DIM_CASE)
#undef OMNI_HEAD_DIM_CASE
    default: return otherwise();
  }
}

}  // namespace omni
