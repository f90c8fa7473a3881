// TMA (bulk tensor copy) descriptors for [B, H, S, D] tensors, and the host check that a tensor meets TMA's
// rules. One function builds the copy both for the kernel parameter's type and at launch.
#pragma once
#include <cute/tensor.hpp>

#include "omni_attention.h"

namespace omni::sm90 {

using namespace cute;

// TMA strides must be positive multiples of 16 bytes below 2^40 bytes. A dim of extent 1 is never stepped
// over, so its stride is free: replace it by 16 bytes so broadcast (stride 0) views of one batch or head pass.
constexpr int64_t kTmaStrideElems = 8;  // 16 bytes of fp16 / bf16

__host__ inline int64_t tma_stride(int64_t stride, int extent) { return extent == 1 ? kTmaStrideElems : stride; }

__host__ inline bool tma_stride_ok(int64_t stride, int extent) {
  const int64_t s = tma_stride(stride, extent);
  return s > 0 && s % kTmaStrideElems == 0 && s * 2 < (int64_t(1) << 40);
}

// True when TMA can read tensor t of [batch, heads, len, D] (the pointer's 16-byte alignment is checked by
// check_tensor for every path).
__host__ inline bool tma_compatible(const OmniTensor& t, int batch, int heads, int len) {
  return len > 0 && tma_stride_ok(t.stride_s, len) && tma_stride_ok(t.stride_h, heads) &&
         tma_stride_ok(t.stride_b, batch);
}

// A TMA load of t, viewed as (seq, dim, head, batch) of head_dim columns, into smem of `smem_layout` (its boxes:
// rows x the kernel's head dim). Columns past head_dim, like rows past len, arrive as zeros.
template <typename Element, class SmemLayout>
__host__ auto make_tma_load(const OmniTensor& t, int batch, int heads, int len, int head_dim, SmemLayout smem_layout) {
  auto g = make_tensor(
      make_gmem_ptr(static_cast<const Element*>(t.ptr)), make_shape(len, head_dim, heads, batch),
      make_stride(tma_stride(t.stride_s, len), _1{}, tma_stride(t.stride_h, heads), tma_stride(t.stride_b, batch)));
  return make_tma_copy(SM90_TMA_LOAD{}, g, smem_layout);
}

}  // namespace omni::sm90
