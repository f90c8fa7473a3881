// Compile-time configuration of the sm_90a backward main kernel: tile sizes, warpgroup roles, the five wgmma
// tiled MMAs and the swizzled shared-memory layouts they read (smem_atoms.cuh; with the transposed views over the
// same bytes).
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "common/bwd_workspace.cuh"
#include "common/bwd_walk.cuh"
#include "sm90/reg_split.cuh"
#include "sm90/smem_atoms.cuh"

namespace omni::sm90 {

using namespace cute;

template <typename Element_, int kHeadDim_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  // Above head dim 128 the dK and dV accumulators of 64 keys by the whole head dim no longer fit one
  // warpgroup's registers, so the CTA takes 64 keys (half a 128-key mask block) and its two consumer
  // warpgroups split the query rows of S^T / dP^T and the head dim of dK / dV; P^T and dS^T then reach the
  // dK / dV GEMMs through shared memory, and the tile's dQ is staged in its own Q / dO stage, which no longer
  // leaves room for a separate dQ block.
  static constexpr bool kWideHead = kHeadDim > 128;
  // One CTA per 128-key mask block (64-key halves of it with kWideHead) walks the 64-row query tiles of its
  // column (the workspace's row tile), two tiles in flight.
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = kWideHead ? 64 : 128;
  static constexpr int kMaskBlockN = 128;  // the mask's block_kv (tuning::bwd_takes_sm90)
  static constexpr int kStages = 2;
  static_assert(kBlockM == bwd::kRowTile, "the workspace pads rows to the backward's tile");
  // Warpgroup 0 produces (TMA and the walk, one warp busy); warpgroups 1 and 2 consume.
  static constexpr int kConsumerWGs = 2;
  static constexpr int kNThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerThreads = 128 * kConsumerWGs;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(reg_split_fits(kProducerRegs, kConsumerRegs, kConsumerWGs), "setmaxnreg split exceeds the launch");

  // S^T = K Q^T and dP^T = V dO^T: [kBlockN keys, kBlockM rows], both operands K-major (head dim contiguous);
  // the warpgroups take 64 keys each, or with kWideHead half the rows each.
  using SdpWGs = conditional_t<kWideHead, Shape<_1, Int<kConsumerWGs>, _1>, Shape<Int<kConsumerWGs>, _1, _1>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float,
                           Shape<_64, Int<kWideHead ? kBlockM / kConsumerWGs : kBlockM>, Int<kHeadDim>>>(),
      Layout<SdpWGs>{}));
  // dV += P^T dO and dK += dS^T Q: [kBlockN, kHeadDim] over the tile's rows, dO^T / Q^T as MN-major views of
  // the row tiles. P^T / dS^T come straight from the S^T accumulator registers (each warpgroup its 64 keys),
  // or with kWideHead from shared memory (each warpgroup a head-dim half over all the tile's rows).
  using TiledMmaDKV = conditional_t<
      kWideHead,
      decltype(make_tiled_mma(
          GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / kConsumerWGs>, Int<kBlockM>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          Layout<Shape<_1, Int<kConsumerWGs>, _1>>{})),
      decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              Layout<Shape<Int<kConsumerWGs>, _1, _1>>{}))>;
  // dQ = dS K: [kBlockM, kHeadDim] over the CTA's keys; dS from shared memory with the rows contiguous, K seen
  // as K^T [kHeadDim, kBlockN]. Each consumer warpgroup takes a head-dim half, unless a half would start inside
  // a swizzle atom of K^T and run past it (head dim 96: halves of 48 columns, atoms of 32), which wgmma cannot
  // address: then each takes every column over its own 64 keys (kDqSplitKeys), and warpgroup 0 adds warpgroup
  // 1's partial sum, passed through the dQ block, before the reduction.
  static constexpr int kDqHalfCols = kHeadDim / kConsumerWGs;
  static constexpr bool kDqSplitKeys =
      kDqHalfCols % atom_cols<kHeadDim>() != 0 && atom_cols<kHeadDim>() % kDqHalfCols != 0;
  static constexpr int kDqWGs = kDqSplitKeys ? 1 : kConsumerWGs;  // warpgroups that one dQ fragment spans
  static constexpr int kDqThreads = 128 * kDqWGs;
  static constexpr int kDqKeys = kDqSplitKeys ? kBlockN / kConsumerWGs : kBlockN;  // keys of one dQ GEMM
  static_assert(!(kDqSplitKeys && kWideHead), "the wide-head layout splits dQ by head dim");
  using TiledMmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / kDqWGs>, Int<kDqKeys>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kDqWGs>, _1>>{}));

  // Q and dO row tiles [kBlockM, kHeadDim, kStages] and K, V [kBlockN, kHeadDim] as TMA writes them: rows of
  // the head dim in 8-row swizzled atoms. The transposed views tile the MN-major atom along the rows first,
  // which is the same bytes (as the forward's V^T).
  using SmemLayoutQ =
      decltype(tile_to_shape(KMajorAtom<Element, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutQt = decltype(tile_to_shape(MNMajorAtom<Element, kHeadDim>{},
                                              Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{}, Step<_2, _1, _3>{}));
  using SmemLayoutK = decltype(tile_to_shape(KMajorAtom<Element, kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutKt =
      decltype(tile_to_shape(MNMajorAtom<Element, kHeadDim>{}, Shape<Int<kHeadDim>, Int<kBlockN>>{}, Step<_2, _1>{}));
  // dS [kBlockM, kBlockN] with the rows contiguous (the A operand of dQ), and dS^T [kBlockN, kBlockM] over the
  // same bytes as a K-major layout: the view the S^T-shaped registers are stored through and, with kWideHead,
  // the A operand of dK. P^T takes the same layout (kWideHead only).
  using SmemLayoutdS =
      decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Element>{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));
  using SmemLayoutdSt =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<Int<kBlockN>, Int<kBlockM>>{}));
  // The tile's dQ in fp32 as the dQ threads hold it (bwd_dq.cuh): kBlockM * kHeadDim floats in two halves,
  // each added to the workspace by one bulk reduction. Without kWideHead both halves are one block of
  // their own; with it the first half overwrites the stage's Q tile and the second its dO tile (each exactly
  // half of the dQ bytes), once every GEMM of the tile is done with them.
  static constexpr int kDqFloats = kBlockM * kHeadDim;
  static constexpr int kDqHalfFloats = kDqFloats / 2;
  static_assert(!kWideHead || kDqHalfFloats * sizeof(float) == kBlockM * kHeadDim * sizeof(Element),
                "a dQ half fills one row tile of Q or dO");

  // Where the call's bias can be staged (bias_stageable), the producer copies each tile's [kBlockM, kBlockN] of it
  // into its stage, rows of kBiasPitch 2-byte elements, so no consumer waits on a global load; with kWideHead the
  // stages would not fit beside the rest, and the consumers read the bias in place.
  static constexpr bool kStagedBias = !kWideHead;
  static constexpr int kBiasPitch = kBlockN + 8;
  static constexpr int kBiasTileBytes = kStagedBias ? kBlockM * kBiasPitch * 2 : 16;

  struct PtBlock {  // kWideHead: P^T for the dV GEMM
    alignas(1024) Element pt[cosize_v<SmemLayoutdSt>];
  };
  struct DqBlock {  // otherwise: the tile's dQ
    alignas(128) float dq[kDqFloats];
  };
  struct SharedStorage {
    alignas(1024) Element q[cosize_v<SmemLayoutQ>];
    alignas(1024) Element dout[cosize_v<SmemLayoutQ>];
    alignas(1024) Element k[cosize_v<SmemLayoutK>];  // reused for dK in the epilogue
    alignas(1024) Element v[cosize_v<SmemLayoutK>];  // reused for dV in the epilogue
    alignas(1024) Element ds[cosize_v<SmemLayoutdS>];
    conditional_t<kWideHead, PtBlock, DqBlock> pt_or_dq;
    alignas(16) char bias[kStages][kBiasTileBytes];  // the tile's bias (kStagedBias)
    alignas(16) float lse2[kStages][kBlockM];
    alignas(16) float dsum[kStages][kBlockM];
    alignas(16) int q_ids[kStages][2 * kBlockM];  // [doc, grp] of the tile's rows (token rule)
    alignas(16) int k_ids[2 * kBlockN];           // [doc, grp] or [first, last] pairs of the CTA's keys
    bwd::QTile tile[kStages];                     // what the producer's walk gave for each stage
    int dq_turn;                                  // the deterministic backward's turn of the tile being reduced
    int64_t dq_passing;                           // its Q tile whose turn is still to pass (take_dq_turn)
    alignas(8) uint64_t kv_full;                  // K, V and k_ids landed
    uint64_t full[kStages];                       // Q, dO, lse2, dsum, q_ids, the bias and the tile landed
    uint64_t empty[kStages];                      // every consumer thread is done with the stage
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static constexpr int kKVBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kRowTileBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kRowScalarBytes = kBlockM * sizeof(float);
};

}  // namespace omni::sm90
