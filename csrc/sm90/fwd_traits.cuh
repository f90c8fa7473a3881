// Compile-time configuration of the sm_90a forward: tile sizes, the warpgroup roles, the wgmma tiled MMAs,
// the swizzled shared-memory layouts that TMA writes and wgmma reads (smem_atoms.cuh), and the shared storage.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/kv_tiles.cuh"
#include "sm90/reg_split.cuh"
#include "sm90/smem_atoms.cuh"

namespace omni::sm90 {

using namespace cute;

// A work item as the producer publishes it to the consumers: its rank (-1: no more work) and tile count.
struct FwdItem {
  int64_t rank;
  int n_tiles;
};

template <typename Element_, int kHeadDim_, int kBlockM_ = 128>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  // One CTA per kBlockM query rows: 128 (a mask block of 128 rows), or 64 (a mask block of 64 rows, or half of
  // one of 128 when the grid is too small to fill the GPU), or 192 at head dim 64 under an implicit mask (which
  // has no block rows: a CTA walks the keys of its own rows, fwd_launch.cuh); key tiles of 128 columns
  // (= block_kv), or of 64 above head dim 128, where two stages of 128-key K and V tiles would not fit in shared
  // memory: each 128-key mask block is walked as two halves (KvTileWalker).
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : 64;
  static constexpr int kStages = 2;
  static_assert(kBlockM == 64 || kBlockM == 128 || (kBlockM == 192 && kHeadDim == 64),
                "a CTA takes 64 or 128 query rows, or 192 at head dim 64");
  // Warpgroup 0 produces (TMA and mask data, one warp busy); each consumer warpgroup takes 64 query rows. Two or
  // three consumer warpgroups take turns at issuing their GEMMs (fwd_kernel.cuh); a single one runs alone.
  static constexpr int kConsumerWGs = kBlockM / 64;
  static constexpr bool kPingPong = kConsumerWGs >= 2;
  static constexpr int kNThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerThreads = 128 * kConsumerWGs;

  // S = Q K^T: both operands K-major in smem; one 64-row wgmma atom per consumer warpgroup.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<Int<64>, Int<kBlockN>, Int<kHeadDim>>>(),
      Layout<Shape<Int<kConsumerWGs>, _1, _1>>{}));
  // O += P V: P from registers, V^T (kHeadDim x kBlockN) MN-major in smem.
  using TiledMmaPV =
      decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, Shape<Int<64>, Int<kHeadDim>, Int<kBlockN>>,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              Layout<Shape<Int<kConsumerWGs>, _1, _1>>{}));

  // Rows of the head dim in 8-row swizzled atoms of 64 (32 at head dim 96) elements, side by side.
  using SmemLayoutQ = decltype(tile_to_shape(KMajorAtom<Element, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(KMajorAtom<Element, kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V is loaded exactly like K (key rows, head dim contiguous). Seen as V^T [kHeadDim, kBlockN] it is the
  // MN-major atom tiled along the keys first, which is the same bytes (fwd_traits_check in fwd_launch.cuh).
  using SmemLayoutV = SmemLayoutK;
  using SmemLayoutVt = decltype(tile_to_shape(MNMajorAtom<Element, kHeadDim>{},
                                              Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{}));

  // Per-tile mask data (tile_aux.cuh): the columns' [doc, grp] ids or the pool rows of the tile.
  static constexpr int kPoolWords = kBlockN / 32;
  static constexpr int kAuxInts = 2 * kBlockN > kBlockM* kPoolWords ? 2 * kBlockN : kBlockM * kPoolWords;

  // 128- and 192-row CTAs run persistent (one per SM, work items from a counter), with a separate buffer for the
  // output tile so the next item's Q can load during an epilogue; 64-row CTAs, and 128-row ones above head dim 128 (no
  // room for that buffer: Q 64 KB + K, V 2 x 2 x 32 KB at 256), run one item and stage O in Q's buffer (each
  // consumer warpgroup in the rows of its own Q).
  static constexpr bool kPersistent = kBlockM >= 128 && kHeadDim <= 128;

  struct SharedStorage {
    alignas(1024) Element q[cosize_v<SmemLayoutQ>];  // also the output tile's buffer, unless persistent
    alignas(1024) Element o[kPersistent ? cosize_v<SmemLayoutQ> : 8];
    alignas(1024) Element k[cosize_v<SmemLayoutK>];
    alignas(1024) Element v[cosize_v<SmemLayoutV>];
    alignas(16) int q_ids[2 * kBlockM];           // [doc, grp] or [first, last] pairs of the query rows (token rule)
    alignas(16) int aux[kStages][kAuxInts];
    KvTile tile[kStages];                          // what the producer decoded for each stage
    FwdItem item;                                  // the work item of the Q in smem
    alignas(8) uint64_t q_full;                    // Q, q_ids and the item landed
    uint64_t q_empty;                              // every consumer thread is done with Q and q_ids
    uint64_t k_full[kStages];                      // K tile, its descriptor and its mask data landed
    uint64_t v_full[kStages];                      // V tile landed
    uint64_t k_empty[kStages];                     // every consumer thread is done with K and the mask data
    uint64_t v_empty[kStages];                     // every consumer thread is done with V
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static constexpr int kTileBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kQBytes = kBlockM * kHeadDim * sizeof(Element);

  // 64-row CTAs that fit twice in an SM's 228 KB of shared memory (head dim 64: 75 KB, 96: 112 KB) run two per
  // SM, so two consumer warpgroups share the tensor cores as in a 128-row CTA. Register split for setmaxnreg (24
  // producer registers spilled its TMA coordinates): 40 * 128 + 232 * 256 of 64K for 128 rows; 40 + 216 of
  // the 128 per thread that two 256-thread CTAs get; 40 + 232 of the 256 of a lone 64-row CTA; 32 * 128 + 160 *
  // 384 for 192 rows (FlashAttention-3's split for its 192-row head-dim-64 tiles).
  static constexpr int kCtasPerSm = kBlockM == 64 && 2 * (kSmemBytes + 1024) <= 228 * 1024 ? 2 : 1;
  static constexpr int kProducerRegs = kConsumerWGs == 3 ? 32 : 40;
  static constexpr int kConsumerRegs = kConsumerWGs == 3 ? 160 : kCtasPerSm == 2 ? 216 : 232;
  static_assert(reg_split_fits(kProducerRegs, kConsumerRegs, kConsumerWGs, kCtasPerSm),
                "setmaxnreg split exceeds the launch");
};

}  // namespace omni::sm90
