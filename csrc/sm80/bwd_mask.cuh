// Masking of one [kBlockM, kBlockN] score tile of the backward by its TileKind, through the shared
// tile_mask.cuh (which applies mask_rule.cuh). FULL tiles inside kv_len run no mask code; PARTIAL tiles are
// evaluated into one bit per score before the S GEMM (no accumulator live yet) and applied after it.
#pragma once
#include <cute/tensor.hpp>

#include "common/bwd_walk.cuh"
#include "common/kv_tiles.cuh"
#include "common/tile_aux.cuh"
#include "common/tile_mask.cuh"

namespace omni::bwd {

using namespace cute;

// Where the tile sits and the token ids staged for it.
struct TileCoords {
  int qpos0;         // absolute position of the tile's row 0: m0 + kv_len - q_len
  int col0;          // first key of the tile
  int col_limit;     // keys of the tile below kv_len
  int jj0;           // first key of the tile inside its mask block (0 unless tiles are halves of blocks)
  const int* q_ids;  // staged [doc, grp] ids of the tile's rows (kTileToken)
  const int* k_ids;  // staged [doc, grp] ids of the CTA's keys (kTileToken)
};

// A fragment as FragmentBits sees it: those hold multiples of 32 elements, so a smaller fragment (16 scores
// per thread when kBlockN = 64) is viewed several times over through a stride-0 mode; its bits are then
// evaluated and applied once per copy, identically. Always a view, never a copy of registers.
template <class T>
__forceinline__ __device__ auto bits_view(T&& t) {
  constexpr int kSize = decltype(size(t))::value;
  if constexpr (kSize % 32 == 0) {
    return make_tensor(t.data(), t.layout());
  } else {
    static_assert(32 % kSize == 0, "fragment size must divide 32");
    return make_tensor(t.data(), make_layout(t.layout(), Layout<Int<32 / kSize>, _0>{}));
  }
}

// The rule of a PARTIAL tile as bits; c: the (row, col) in the tile of each fragment element. Pool tiles
// read the pattern rows ii0 .. ii0 + kBlockM - 1, columns jj0 .. jj0 + kBlockN - 1 of their entry in place (a
// one-entry pool view whose rows keep the block's stride).
template <int kBlockM, int kBlockN, class Bits, class TC>
__forceinline__ __device__ void partial_bits(Bits& bits, const TC& c, const QTile& tile, const TileCoords& at,
                                             const OmniMask& mask) {
  if (tile.kind == kTileToken) {
    token_bits<kBlockM, kBlockN>(bits, c, at.q_ids, at.k_ids, at.qpos0, at.col0, mask);
  } else if (tile.kind == kTilePool) {
    pool_bits(bits, c, pool_rows_view<kBlockM>(mask, tile.pool, tile.ii0, at.jj0), at.col_limit);
  }
}

// Masks the scores s (-inf where not allowed). Rows past q_len need no mask: their lse2 is +inf, so P = 0.
template <class TS, class TC, class Bits>
__forceinline__ __device__ void mask_q_tile(TS& s, const TC& c, const QTile& tile, const TileCoords& at,
                                            const Bits& bits) {
  switch (tile.kind) {
    case kTileFull:
      break;
    case kTileColLimit:
      mask_col_limit(s, c, at.col_limit);
      break;
    case kTileCausal:
      mask_causal(s, c, at.qpos0, at.col0);
      break;
    default: {
      auto s_bits = bits_view(s);
      bits.apply(s_bits);
      break;
    }
  }
}

}  // namespace omni::bwd
