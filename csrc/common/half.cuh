// fp16 / bf16 element types chosen by a flag, for the kernels written in plain CUDA (decode, merge).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace omni {

template <bool kBf16>
using Half = std::conditional_t<kBf16, __nv_bfloat16, __half>;
template <bool kBf16>
using Half2 = std::conditional_t<kBf16, __nv_bfloat162, __half2>;

__device__ inline float2 to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
__device__ inline float2 to_float2(__half2 x) { return __half22float2(x); }

}  // namespace omni
