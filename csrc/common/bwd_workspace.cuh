// What a backward launch needs besides OmniBwdParams: the layout of its workspace, shared by the entry point that
// carves it and by both kernel families.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "host/dispatch.cuh"
#include "omni_attention.h"

namespace omni::bwd {

constexpr int kRowTile = 64;  // query rows per tile in every backward kernel; the workspace pads to it
constexpr float kLog2e = 1.4426950408889634f;  // lse2 = lse * kLog2e: the kernels exponentiate in base 2

// fp32 scratch of the backward, rows padded to kRowTile so tiles read and write without predicates:
//   dq_accum [B, Hq, q_pad, D]  dQ / scale summed over the KV blocks, zeroed by the preprocess; D the kernels' head
//                               dim (kernel_head_dim, host/dispatch.cuh), the call's head_dim or more; row-major for
//                               the sm_80 kernels (atomics), each kRowTile-row tile in the consumer threads'
//                               order for the sm_90a ones (bulk reductions, sm90/bwd_dq.cuh)
//   lse2     [B, Hq, q_pad]     lse * log2(e); +inf for empty rows (lse = -inf) and padding rows
//   dsum     [B, Hq, q_pad]     D = rowsum(dO * O); 0 for padding rows
//   dq_turns [B, Hq, q_pad / kRowTile] int32: the deterministic backward's turn counter of each Q tile
//                               (bwd_turns.cuh), zeroed by the preprocess
struct Workspace {
  float* dq_accum;
  float* lse2;
  float* dsum;
  int* dq_turns;
  int64_t q_pad;
};

inline int64_t padded_rows(int q_len) { return (static_cast<int64_t>(q_len) + kRowTile - 1) / kRowTile * kRowTile; }

inline size_t workspace_bytes(const OmniFwdParams& f) {
  const int64_t rows = static_cast<int64_t>(f.batch) * f.heads_q * padded_rows(f.q_len);
  return static_cast<size_t>(rows) * (kernel_head_dim(f.head_dim) + 2) * sizeof(float) +
         static_cast<size_t>(rows / kRowTile) * sizeof(int);
}

// Carves the workspace at `base` (16-byte aligned, workspace_bytes(f) long).
inline Workspace carve_workspace(void* base, const OmniFwdParams& f) {
  const int64_t q_pad = padded_rows(f.q_len);
  const int64_t rows = static_cast<int64_t>(f.batch) * f.heads_q * q_pad;
  const int64_t dim = kernel_head_dim(f.head_dim);
  float* dq_accum = static_cast<float*>(base);
  return {dq_accum, dq_accum + rows * dim, dq_accum + rows * (dim + 1),
          reinterpret_cast<int*>(dq_accum + rows * (dim + 2)), q_pad};
}

}  // namespace omni::bwd
