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

// ---------------------------------------------------------------------- implicit masks (no block lists)
// OMNI_MASK_CAUSAL and OMNI_MASK_FULL: each row's and column's blocks and their types follow from positions.
// Every block with an allowed pair is listed (a listed block may hold none only at the ends of a window).

// A run of consecutive blocks of one row (or column) of the block table.
struct BlockSpan {
  int first, count;
};

__host__ __device__ inline int min_int(int a, int b) { return a < b ? a : b; }
__host__ __device__ inline int max_int(int a, int b) { return a > b ? a : b; }

// Last absolute query position of the Q block whose first row is at qpos_first (the rows end at kv_len - 1).
__host__ __device__ inline int implicit_last_qpos(const OmniMask& m, int qpos_first, int kv_len) {
  return min_int(qpos_first + m.block_q - 1, kv_len - 1);
}

// The keys first .. first + count - 1 that a query position in qpos_first .. qpos_last may see under an
// implicit mask (count <= 0: none).
__host__ __device__ inline BlockSpan implicit_key_range(const OmniMask& m, int qpos_first, int qpos_last, int kv_len) {
  if (m.kind == OMNI_MASK_FULL) return {0, kv_len};
  const int first = m.window > 0 ? max_int(qpos_first - m.window + 1, 0) : 0;
  return {first, min_int(qpos_last + 1, kv_len) - first};
}

// The KV blocks of the Q block whose first row is at absolute position qpos_first: those holding its key range.
__host__ __device__ inline BlockSpan implicit_row_span(const OmniMask& m, int qpos_first, int kv_len) {
  if (m.kind == OMNI_MASK_FULL) return {0, (kv_len + m.block_kv - 1) / m.block_kv};
  const BlockSpan keys = implicit_key_range(m, qpos_first, implicit_last_qpos(m, qpos_first, kv_len), kv_len);
  if (keys.count <= 0) return {0, 0};
  const int first = keys.first / m.block_kv;
  return {first, (keys.first + keys.count - 1) / m.block_kv - first + 1};
}

// The Q blocks of KV block kb.
__host__ __device__ inline BlockSpan implicit_column_span(const OmniMask& m, int kb, int q_len, int kv_len) {
  if (m.kind == OMNI_MASK_FULL) return {0, (q_len + m.block_q - 1) / m.block_q};
  const int offset = kv_len - q_len;
  const int k_first = kb * m.block_kv;
  const int row_first = max_int(k_first - offset, 0);  // the first row whose position reaches the block
  int row_last = q_len - 1;
  if (m.window > 0) row_last = min_int(row_last, min_int(k_first + m.block_kv, kv_len) - 1 + m.window - 1 - offset);
  if (row_first > row_last) return {0, 0};
  const int first = row_first / m.block_q;
  return {first, row_last / m.block_q - first + 1};
}

// The type of block kb for query positions qpos_first .. qpos_last: FULL, CAUSAL, or PARTIAL by the token
// rule (pool id -1, no ids: one document of text) where the window cuts it.
__host__ __device__ inline int implicit_block_type(const OmniMask& m, int qpos_first, int qpos_last, int kb,
                                                   int kv_len) {
  if (m.kind == OMNI_MASK_FULL) return OMNI_FULL;
  const int k_first = kb * m.block_kv;
  const int k_last = min_int(k_first + m.block_kv, kv_len) - 1;
  if (m.window > 0 && qpos_last - k_first >= m.window) return OMNI_PARTIAL;
  return k_last <= qpos_first ? OMNI_FULL : OMNI_CAUSAL;
}

// The element rule of an implicit mask: may the query at absolute position qpos see key j (< kv_len)?
__host__ __device__ inline bool implicit_allowed(const OmniMask& m, int qpos, int j) {
  return m.kind == OMNI_MASK_FULL || (j <= qpos && (m.window <= 0 || qpos - j < m.window));
}

// ---------------------------------------------------------------------- the element rule per block type

// CAUSAL blocks: absolute query position against key position.
__host__ __device__ inline bool causal_allowed(int qpos, int j) { return qpos >= j; }

// PARTIAL blocks from the pool: ii, jj are the row and column inside the block.
__host__ __device__ inline bool pool_allowed(const OmniMask& m, int p, int ii, int jj) {
  const int words = m.block_kv / 32;
  const uint32_t word =
      static_cast<uint32_t>(m.partial_pool[(static_cast<int64_t>(p) * m.block_q + ii) * words + jj / 32]);
  return (word >> (jj % 32)) & 1u;
}

// The sliding window's test: may the query at qpos see key j (window <= 0: no window)?
__host__ __device__ inline bool in_window(int qpos, int j, int window) { return window <= 0 || qpos - j < window; }

// PARTIAL blocks by the token rule, from the per-token ids of the query (at qpos) and the key (at j), the window
// over its causal part.
__host__ __device__ inline bool token_allowed(int q_doc, int q_grp, int k_doc, int k_grp, int qpos, int j, int window) {
  const bool causal_part = j <= qpos && in_window(qpos, j, window);
  const bool group_part = q_grp >= 0 && q_grp == k_grp;
  return q_doc >= 0 && q_doc == k_doc && (causal_part || group_part);
}

// The token rule of a mask: with covers_groups (OmniMask::window_covers_groups) the window cuts group pairs too,
// which is the rule above and the window's test (the kernels apply that test as a pass of its own).
__host__ __device__ inline bool token_allowed(int q_doc, int q_grp, int k_doc, int k_grp, int qpos, int j, int window,
                                              bool covers_groups) {
  return token_allowed(q_doc, q_grp, k_doc, k_grp, qpos, j, window) && (!covers_groups || in_window(qpos, j, window));
}

}  // namespace omni
