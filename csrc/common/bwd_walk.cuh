// The work list of one backward CTA: the active Q tiles of its KV block, for each query head of its GQA
// group, read from the column view OmniMask.q (rows of that list are KV blocks) or derived from positions for
// an implicit mask (mask_rule.cuh's implicit_column_span). A mask Q block of
// block_q rows is block_q / kBlockM tiles; tiles past q_len are skipped, and MASKED blocks are absent
// from the list (entries that are MASKED or out of range anyway are skipped, never read through).
// The cursor lives in shared memory and one thread advances it, so the walk holds no registers across
// the kernel's main loop.
#pragma once
#include "common/kv_tiles.cuh"
#include "common/mask_rule.cuh"

namespace omni::bwd {

// One Q tile against the CTA's KV block.
struct QTile {
  int h;        // query head
  int m_block;  // tile index along the query rows: rows m_block * kBlockM ...
  int kind;     // TileKind: how the tile is masked
  int pool;     // partial-pool entry of kTilePool tiles
  int ii0;      // first row of the tile inside its mask block (pool rows)
  int valid;    // 0 once the walk is over
  int turn;     // the deterministic backward's turn at the tile's dQ (bwd_turns.cuh), where its kernel sets it
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
  // b: batch; h_first: first query head of the group; n_block: the KV block of the CTA.
  __device__ ColumnWalk(const OmniMask& mask, int b, int h_first, int group, int n_block, int q_len, int kv_len)
      : mask_(mask), b_(b), h_first_(h_first), group_(group), n_block_(n_block), q_len_(q_len), kv_len_(kv_len) {}

  // The cursor before the first tile.
  __device__ WalkCursor start() const { return {0, count(0), 0, 0, 0, OMNI_MASKED, -1}; }

  // The tile at cursor `at` or the first live one after it, moving `at` past it; valid = 0 at the end.
  __device__ QTile next(WalkCursor& at) const {
    const int tiles_per_block = mask_.block_q / kBlockM;
    while (at.g < group_) {
      if (at.e < at.count) {
        if (at.s == 0) read_entry(at);
        const int m_block = at.qb * tiles_per_block + at.s;
        const bool live = at.qb >= 0 && at.type != OMNI_MASKED && at.pool < mask_.num_partial;
        if (live && at.s < tiles_per_block && m_block * kBlockM < q_len_) {
          ++at.s;
          return {h_first_ + at.g, m_block, kind_of(at.type, at.pool), at.pool, (at.s - 1) * kBlockM, 1};
        }
        at.s = 0;
        ++at.e;
      } else if (++at.g < group_) {
        at.count = count(at.g);
        at.e = 0;
      }
    }
    return {0, 0, kTileFull, -1, 0, 0};
  }

 private:
  __device__ BlockRow row(int g) const { return block_row(mask_.q, b_, mask_.heads == 1 ? 0 : h_first_ + g, n_block_); }
  __device__ int count(int g) const {
    return mask_.kind == OMNI_MASK_BLOCKS ? row(g).count : implicit_column_span(mask_, n_block_, q_len_, kv_len_).count;
  }
  // Entry at.e of head at.g's list: its Q block, type and pool entry.
  __device__ void read_entry(WalkCursor& at) const {
    if (mask_.kind == OMNI_MASK_BLOCKS) {
      const BlockRow r = row(at.g);
      at.qb = r.indices[at.e];
      at.type = r.types[at.e];
      at.pool = r.partial[at.e];
      return;
    }
    at.qb = implicit_column_span(mask_, n_block_, q_len_, kv_len_).first + at.e;
    const int qpos_first = at.qb * mask_.block_q + kv_len_ - q_len_;
    at.type = implicit_block_type(mask_, qpos_first, implicit_last_qpos(mask_, qpos_first, kv_len_), n_block_, kv_len_);
    at.pool = -1;
  }
  __device__ int kind_of(int type, int pool) const {
    if (type == OMNI_FULL) return (n_block_ + 1) * mask_.block_kv > kv_len_ ? kTileColLimit : kTileFull;
    if (type == OMNI_CAUSAL) return kTileCausal;
    return pool >= 0 ? kTilePool : kTileToken;
  }

  const OmniMask& mask_;
  int b_, h_first_, group_, n_block_, q_len_, kv_len_;
};

}  // namespace omni::bwd
