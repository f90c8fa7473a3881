// dQ accumulation of the backward: a register fragment added to fp32 global memory with atomics.
#pragma once
#include <cute/tensor.hpp>

namespace omni::bwd {

using namespace cute;

// dst (gmem fp32, partitioned like acc by partition_C) += acc. On sm_90 as float2 atomics (the two values
// of an m16n8 accumulator pair are adjacent columns), one float each before.
template <class Acc, class Dst>
__forceinline__ __device__ void atomic_add_fragment(const Acc& acc, Dst& dst) {
  static_assert(decltype(size<0, 0>(dst))::value == 2 && decltype(stride<0, 0>(dst))::value == 1,
                "accumulator value pairs must be adjacent columns");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {
    atomicAdd(reinterpret_cast<float2*>(&dst(i)), make_float2(acc(i), acc(i + 1)));
  }
#else
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) atomicAdd(&dst(i), acc(i));
#endif
}

}  // namespace omni::bwd
