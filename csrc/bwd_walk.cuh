// The work list of one backward CTA: the active Q tiles of its KV block, for each query head of its GQA
// group, read from the column view OmniMask.q (rows of that list are KV blocks). A mask Q block of
// block_q rows is block_q / kBlockM tiles; tiles past q_len are skipped, and MASKED blocks are absent
// from the list (entries that are MASKED or out of range anyway are skipped, never read through).
// The cursor lives in shared memory and one thread advances it, so the walk holds no registers across
// the kernel's main loop.
#pragma once
#include "kv_tiles.cuh"
#include "mask_rule.cuh"

namespace omni::bwd {

// One Q tile against the CTA's KV block.
struct QTile {
  int h;        // query head
  int m_block;  // tile index along the query rows: rows m_block * kBlockM ...
  int kind;     // TileKind: how the tile is masked
  int pool;     // partial-pool entry of kTilePool tiles
  int ii0;      // first row of the tile inside its mask block (pool rows)
  int valid;    // 0 once the walk is over
};

// Position in the walk: head of the group, entry of that head's list, tile inside the entry's block.
struct WalkCursor {
  int g, e, s;
};

template <int kBlockM>
class ColumnWalk {
 public:
  // b: batch; h_first: first query head of the group; kv_tail: the KV block reaches past kv_len.
  __device__ ColumnWalk(const OmniMask& mask, int b, int h_first, int group, int n_block, int q_len, bool kv_tail)
      : mask_(mask), b_(b), h_first_(h_first), group_(group), n_block_(n_block),
        tiles_per_block_(mask.block_q / kBlockM), q_tiles_((q_len + kBlockM - 1) / kBlockM), kv_tail_(kv_tail) {}

  // The tile at cursor `at` or the first live one after it, moving `at` past it; valid = 0 at the end.
  __device__ QTile next(WalkCursor& at) const {
    for (; at.g < group_; ++at.g, at.e = 0) {
      const BlockRow row = block_row(mask_.q, b_, mask_.heads == 1 ? 0 : h_first_ + at.g, n_block_);
      for (; at.e < row.count; ++at.e, at.s = 0) {
        const int qb = row.indices[at.e];
        const int type = row.types[at.e];
        const int pool = row.partial[at.e];
        const int m_block = qb * tiles_per_block_ + at.s;
        const bool live = qb >= 0 && type != OMNI_MASKED && pool < mask_.num_partial;
        if (live && at.s < tiles_per_block_ && m_block < q_tiles_) {
          ++at.s;
          return {h_first_ + at.g, m_block, kind_of(type, pool), pool, (at.s - 1) * kBlockM, 1};
        }
      }
    }
    return {0, 0, kTileFull, -1, 0, 0};
  }

 private:
  __device__ int kind_of(int type, int pool) const {
    if (type == OMNI_FULL) return kv_tail_ ? kTileColLimit : kTileFull;
    if (type == OMNI_CAUSAL) return kTileCausal;
    return pool >= 0 ? kTilePool : kTileToken;
  }

  const OmniMask& mask_;
  int b_, h_first_, group_, n_block_, tiles_per_block_, q_tiles_;
  bool kv_tail_;
};

}  // namespace omni::bwd
