// Host helpers that turn run-time sizes and flags into template arguments.
#pragma once
#include <type_traits>

#include "host/table.h"
#include "omni_attention.h"

namespace omni {

// Calls f(std::integral_constant<bool, cond>{}).
template <typename F>
int dispatch_bool(bool cond, F&& f) {
  return cond ? f(std::true_type{}) : f(std::false_type{});
}

// Whether the kernels take mask blocks of `size` rows or columns (host/table.h).
constexpr bool supported_block_size(int size) {
#define OMNI_IS_BLOCK_SIZE(B) size == B ||
  return OMNI_FOR_EACH_BLOCK_SIZE(OMNI_IS_BLOCK_SIZE) false;
#undef OMNI_IS_BLOCK_SIZE
}

// Calls f(std::integral_constant<int, size>{}) for a supported mask block size (checked by the caller, else
// OMNI_ERR_BLOCK_SIZE).
template <typename F>
int dispatch_block(int size, F&& f) {
  switch (size) {
#define OMNI_BLOCK_SIZE_CASE(B) \
  case B:                       \
    return f(std::integral_constant<int, B>{});
    OMNI_FOR_EACH_BLOCK_SIZE(OMNI_BLOCK_SIZE_CASE)
#undef OMNI_BLOCK_SIZE_CASE
    default:
      return OMNI_ERR_BLOCK_SIZE;
  }
}

// The instantiated head dim whose kernels run calls of head dim `head_dim` (host/table.h): the smallest one at or
// above it, whose loads read the columns past head_dim as zeros and whose stores write the first head_dim only; 0
// when head_dim is not a positive multiple of 8 (16-byte rows) up to the largest.
constexpr int kernel_head_dim(int head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0) return 0;
#define OMNI_AT_OR_ABOVE(D) \
  if (head_dim <= D) return D;
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

// Shared memory per block of the sm_80 forward at (head dim, block_q) and backward at (head dim, block_kv) as the
// table lists them (host/table.h; 0 where it lists none): their launchers static_assert their traits against these,
// and Python compares the same figures with a GPU's opt-in shared memory before it picks the kernels.
#define OMNI_SMEM_ENTRY(D, B, N) \
  if (head_dim == D && block == B) return N;
constexpr int sm80_fwd_smem_bytes(int head_dim, int block) {
  OMNI_FOR_EACH_SM80_FWD_SMEM(OMNI_SMEM_ENTRY)
  return 0;
}
constexpr int sm80_bwd_smem_bytes(int head_dim, int block) {
  OMNI_FOR_EACH_SM80_BWD_SMEM(OMNI_SMEM_ENTRY)
  return 0;
}
#undef OMNI_SMEM_ENTRY

// Calls f(std::integral_constant<int, D>{}) for D = kernel_head_dim(head_dim), else (0) otherwise().
template <typename F, typename G>
auto dispatch_head_dim(int head_dim, F&& f, G&& otherwise) -> decltype(otherwise()) {
  switch (kernel_head_dim(head_dim)) {
#define OMNI_HEAD_DIM_CASE(D) \
  case D:                     \
    return f(std::integral_constant<int, D>{});
    OMNI_FOR_EACH_HEAD_DIM(OMNI_HEAD_DIM_CASE)
#undef OMNI_HEAD_DIM_CASE
    default:
      return otherwise();
  }
}

}  // namespace omni
