// Per-tile mask data staged in shared memory next to the K tile, with cp.async so no register holds it:
//   token ids: [doc[kCount], grp[kCount]] of kCount consecutive positions;
//   token ranges: [first, last] of kCount consecutive positions, the allowed keys of each as a query or the
//              allowed queries of each as a key (OmniMask::token_ranges; the sm_90a kernels' token rule);
//   pool rows: the kRows x kWords words of one PARTIAL pattern that a tile's columns cover, laid out as a
//              one-entry pool [1][kRows][kWords] so mask_rule.cuh's pool_allowed reads it unchanged.
// Missing id arrays mean one document (doc 0) and all text (grp -1); positions outside [0, kv_len) get doc -1
// (padding), so tails and rows before the first key are never allowed.
#pragma once
#include <cute/arch/copy_sm80.hpp>

#include "omni_attention.h"

namespace omni {

__forceinline__ __device__ void cp_async_4(int* smem_dst, const int* gmem_src) {
  cute::SM80_CP_ASYNC_CACHEALWAYS<uint32_t>::copy(*reinterpret_cast<const uint32_t*>(gmem_src),
                                                  *reinterpret_cast<uint32_t*>(smem_dst));
}

// The token ids of batch b (NULL when absent).
__forceinline__ __device__ const int* batch_ids(const int32_t* ids, int64_t stride_b, int b) {
  return ids != nullptr ? ids + b * stride_b : nullptr;
}

// Stages the ids of positions pos0 .. pos0 + kCount - 1 (of one batch row) into smem[0 .. 2 * kCount).
template <int kCount, int kNThreads>
__forceinline__ __device__ void stage_token_ids(int* smem, const int* doc, const int* grp, int pos0, int kv_len,
                                                int tid) {
  CUTE_UNROLL
  for (int idx = tid; idx < 2 * kCount; idx += kNThreads) {
    const bool is_grp = idx >= kCount;
    const int pos = pos0 + (is_grp ? idx - kCount : idx);
    const int* src = is_grp ? grp : doc;
    if (pos < 0 || pos >= kv_len) {
      smem[idx] = -1;
    } else if (src == nullptr) {
      smem[idx] = is_grp ? -1 : 0;
    } else {
      cp_async_4(smem + idx, src + pos);
    }
  }
}

// Whether the token rule of batch row b can be staged as ranges: given for the row (not marked INT32_MIN there), or
// following from positions alone where there are no ids (one document of text: an implicit causal mask's window).
__forceinline__ __device__ bool token_ranges_apply(const OmniMask& m, int b) {
  if (m.doc_ids == nullptr) return m.group_ids == nullptr;
  return m.token_ranges != nullptr && m.token_ranges[4 * (b * m.ids_stride_b)] != INT32_MIN;
}

// Stages the ranges of positions pos0 .. pos0 + kCount - 1 of batch row b into smem[0 .. 2 * kCount) as (first,
// last) pairs: the allowed keys of each position as a query (kAsKey false) or its allowed queries as a key.
// Positions outside [0, kv_len) get the empty range (0, -1). Only where token_ranges_apply.
template <int kCount, int kNThreads, bool kAsKey>
__forceinline__ __device__ void stage_token_ranges(int* smem, const OmniMask& m, int b, int pos0, int kv_len, int tid) {
  CUTE_UNROLL
  for (int idx = tid; idx < kCount; idx += kNThreads) {
    const int pos = pos0 + idx;
    int2* dst = reinterpret_cast<int2*>(smem) + idx;
    if (pos < 0 || pos >= kv_len) {
      *dst = make_int2(0, -1);
    } else if (m.doc_ids != nullptr) {
      const int* src = m.token_ranges + 4 * (b * m.ids_stride_b + pos) + (kAsKey ? 2 : 0);
      cute::SM80_CP_ASYNC_CACHEALWAYS<uint64_t>::copy(*reinterpret_cast<const uint64_t*>(src),
                                                      *reinterpret_cast<uint64_t*>(dst));
    } else {  // all text of one document: the causal window
      const int reach = m.window > 0 ? m.window - 1 : kv_len;
      *dst = kAsKey ? make_int2(pos, reach < kv_len - 1 - pos ? pos + reach : kv_len - 1)
                    : make_int2(reach < pos ? pos - reach : 0, pos);
    }
  }
}

// Stages the words of pool entry p covering block rows ii0 .. ii0 + kRows - 1 and block columns
// jj0 .. jj0 + 32 * kWords - 1.
template <int kRows, int kWords, int kNThreads>
__forceinline__ __device__ void stage_pool_rows(int* smem, const OmniMask& mask, int p, int ii0, int jj0, int tid) {
  const int words_per_row = mask.block_kv / 32;
  const int* rows = mask.partial_pool + (int64_t(p) * mask.block_q + ii0) * words_per_row + jj0 / 32;
  CUTE_UNROLL
  for (int idx = tid; idx < kRows * kWords; idx += kNThreads) {
    cp_async_4(smem + idx, rows + (idx / kWords) * words_per_row + idx % kWords);
  }
}

// The staged pool rows as an OmniMask whose pool holds one entry of kRows x (32 * kWords).
template <int kRows, int kWords>
__forceinline__ __device__ OmniMask staged_pool_view(const int* smem) {
  OmniMask view{};
  view.partial_pool = smem;
  view.num_partial = 1;
  view.block_q = kRows;
  view.block_kv = 32 * kWords;
  return view;
}

// Rows ii0 .. ii0 + kRows - 1 of pool entry `pool` from column jj0 (a multiple of 32) of its mask block on, read
// in place: a one-entry pool view whose rows keep the block's stride.
template <int kRows>
__forceinline__ __device__ OmniMask pool_rows_view(const OmniMask& m, int pool, int ii0, int jj0) {
  OmniMask view{};
  view.partial_pool = m.partial_pool + (int64_t(pool) * m.block_q + ii0) * (m.block_kv / 32) + jj0 / 32;
  view.num_partial = 1;
  view.block_q = kRows;
  view.block_kv = m.block_kv;
  return view;
}

}  // namespace omni
