// The key tiles one query tile visits: the active blocks of its row of the block list (mask_rule.cuh's
// block_row), or of an implicit mask's row (mask_rule.cuh's implicit_row_span), each cut into block_kv / kBlockN
// tiles. MASKED blocks are absent from the list, so never seen. Only the row's list offset and count are kept in
// registers; the list pointers stay in the kernel params.
#pragma once
#include "common/mask_rule.cuh"

namespace omni {

// How a tile is masked. FULL tiles that reach past kv_len need the column limit and nothing else. The walks give
// kTileToken for the token rule; the sm_90a producers make it kTileTokenRanges where the rows' ranges apply
// (tile_aux.cuh's token_ranges_apply).
enum TileKind : int {
  kTileFull = 0,
  kTileColLimit = 1,
  kTileCausal = 2,
  kTilePool = 3,
  kTileToken = 4,
  kTileTokenRanges = 5,
};

// One tile: its first key column, how to mask it, and its pool entry (PARTIAL from the pool only).
struct KvTile {
  int col0;
  int kind;
  int pool;
};

// The raw list entry of a block, fetched a tile ahead of its use to hide the global-load latency.
struct KvEntry {
  int index;
  int type;
  int partial;
};

template <int kBlockN>
struct KvTileWalker {
  int64_t list_offset;  // of the row's entries in indices / types / partial; implicit masks: its first KV block
  int count;            // active blocks in the row

  // The walk of Q block `row` (batch b, mask head h) whose first row sits at absolute position qpos0.
  __device__ KvTileWalker(const OmniMask& m, int b, int h, int row, int qpos0, int kv_len) {
    if (m.kind == OMNI_MASK_BLOCKS) {
      const BlockRow r = block_row(m.kv, b, h, row);
      list_offset = r.indices - m.kv.indices;
      count = r.count;
    } else {
      const BlockSpan span = implicit_row_span(m, qpos0, kv_len);
      list_offset = span.first;
      count = span.count;
    }
  }

  __device__ static int sub_shift(int block_kv) { return block_kv == kBlockN ? 0 : 1; }

  __device__ int num_tiles(int block_kv) const { return count << sub_shift(block_kv); }

  // The list entry of the block holding tile t (qpos0 and kv_len as given to the constructor).
  __device__ KvEntry fetch(const OmniMask& m, int t, int qpos0, int kv_len) const {
    const int64_t i = list_offset + (t >> sub_shift(m.block_kv));
    if (m.kind != OMNI_MASK_BLOCKS) {
      const int kb = static_cast<int>(i);
      return {kb, implicit_block_type(m, qpos0, implicit_last_qpos(m, qpos0, kv_len), kb, kv_len), -1};
    }
    return {m.kv.indices[i], m.kv.types[i], m.kv.partial[i]};
  }

  __device__ static KvTile decode(const KvEntry& e, int t, int block_kv, int kv_len) {
    const int col0 = e.index * block_kv + (t & ((1 << sub_shift(block_kv)) - 1)) * kBlockN;
    int kind;
    if (e.type == OMNI_FULL) {
      kind = col0 + kBlockN > kv_len ? kTileColLimit : kTileFull;
    } else if (e.type == OMNI_CAUSAL) {
      kind = kTileCausal;
    } else {
      kind = e.partial >= 0 ? kTilePool : kTileToken;
    }
    return {col0, kind, e.partial};
  }
};

}  // namespace omni
