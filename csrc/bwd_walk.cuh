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

// Position in the walk, with what was read for it: head g of the group (its list has `count` entries),
// entry e of that list (block qb, its type and pool entry), tile s of that entry's block next. Tiles of
// the same entry need no further reads.
struct WalkCursor {
  int g, count, e, s;
  int qb, type, pool;
};

template <int kBlockM>
class ColumnWalk {
 public:
  // b: batch; h_first: first query head of the group; kv_tail: the KV block reaches past kv_len.
  __device__ ColumnWalk(const OmniMask& mask, int b, int h_first, int group, int n_block, int q_len, bool kv_tail)
      : mask_(mask), b_(b), h_first_(h_first), group_(group), n_block_(n_block),
        tiles_per_block_(mask.block_q / kBlockM), q_tiles_((q_len + kBlockM - 1) / kBlockM), kv_tail_(kv_tail) {}

  // The cursor before the first tile.
  __device__ WalkCursor start() const { return {0, row(0).count, 0, 0, 0, OMNI_MASKED, -1}; }

  // The tile at cursor `at` or the first live one after it, moving `at` past it; valid = 0 at the end.
  __device__ QTile next(WalkCursor& at) const {
    while (at.g < group_) {
      if (at.e < at.count) {
        if (at.s == 0) {
          const BlockRow r = row(at.g);
          at.qb = r.indices[at.e];
          at.type = r.types[at.e];
          at.pool = r.partial[at.e];
        }
        const int m_block = at.qb * tiles_per_block_ + at.s;
        const bool live = at.qb >= 0 && at.type != OMNI_MASKED && at.pool < mask_.num_partial;
        if (live && at.s < tiles_per_block_ && m_block < q_tiles_) {
          ++at.s;
          return {h_first_ + at.g, m_block, kind_of(at.type, at.pool), at.pool, (at.s - 1) * kBlockM, 1};
        }
        at.s = 0;
        ++at.e;
      } else if (++at.g < group_) {
        at.count = row(at.g).count;
        at.e = 0;
      }
    }
    return {0, 0, kTileFull, -1, 0, 0};
  }

 private:
  __device__ BlockRow row(int g) const {
    return block_row(mask_.q, b_, mask_.heads == 1 ? 0 : h_first_ + g, n_block_);
  }
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
