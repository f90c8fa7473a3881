// The element rule of omni_attention.h, one function per block type, for kernels and tests.
// Kernels apply these to register fragments; keep every kernel on these definitions.
#pragma once
#include "omni_attention.h"

namespace omni {

// The active block list of one row (Q block in the row view, KV block in the column view).
struct BlockRow {
  const int32_t* indices;
  const int8_t* types;
  const int32_t* partial;
  int count;
};

__host__ __device__ inline BlockRow block_row(const OmniBlockList& list, int b, int h, int row) {
  const int64_t head = b * list.stride_b + h * list.stride_h;
  const int64_t lists = (head + row) * list.max_blocks;
  return {list.indices + lists, list.types + lists, list.partial + lists, list.num_blocks[head + row]};
}

// CAUSAL blocks: absolute query position against key position.
__host__ __device__ inline bool causal_allowed(int qpos, int j) { return qpos >= j; }

// PARTIAL blocks from the pool: ii, jj are the row and column inside the block.
__host__ __device__ inline bool pool_allowed(const OmniMask& m, int p, int ii, int jj) {
  const int words = m.block_kv / 32;
  const uint32_t word = static_cast<uint32_t>(m.partial_pool[(static_cast<int64_t>(p) * m.block_q + ii) * words + jj / 32]);
  return (word >> (jj % 32)) & 1u;
}

// PARTIAL blocks by the token rule, from the per-token ids of the query (at qpos) and the key (at j).
__host__ __device__ inline bool token_allowed(int q_doc, int q_grp, int k_doc, int k_grp, int qpos, int j,
                                              int window) {
  const bool causal_part = j <= qpos && (window <= 0 || qpos - j < window);
  const bool group_part = q_grp >= 0 && q_grp == k_grp;
  return q_doc >= 0 && q_doc == k_doc && (causal_part || group_part);
}

}  // namespace omni
