// Compile-time configuration of the sm_80 backward kernel. One CTA owns one KV tile of kBlockN keys (the mask's
// block_kv, or 64-key halves of 128-key blocks at head dim 256, or 32-key quarters or halves of blocks at 512) and
// walks the active Q tiles of its block's column, kBlockM = 64 query rows at a time (a 128-row mask block is two
// tiles). The MMA atoms, the swizzled smem atom and the gmem copies come from the shared Sm80Base; the backward adds
// its three tiled MMAs and its transposed smem views.
//
// Head dim 512 fits an SM's shared memory only with one buffer for Q and dO (the next tile loads after the current
// one is done) and 32-key tiles; its dQ is computed and added in two 256-column halves, each of which takes the
// registers a whole dQ takes at 256.
#pragma once
#include "common/bwd_walk.cuh"
#include "sm80/kernel_traits.cuh"

namespace omni::bwd {

using namespace cute;

template <typename Element_, int kHeadDim_, int kBlockN_>
struct Traits : Sm80Base<Element_, kHeadDim_, /*kNWarps=*/8> {
  using Base = Sm80Base<Element_, kHeadDim_, 8>;
  using Element = Element_;
  using Base::kHeadDim;
  using Base::kNThreads;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = kBlockN_;
  static_assert(kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 256 || kHeadDim == 512,
                "head dim 64, 96, 128, 256 or 512");
  static_assert(kBlockN == 32 || kBlockN == 64 || kBlockN == 128, "key tiles of 32, 64 or 128");
  static constexpr int kQBuffers = kHeadDim > 256 ? 1 : 2;  // buffers of Q, dO and their rows' data
  static constexpr int kDQ = kHeadDim > 256 ? 256 : kHeadDim;  // dQ columns computed at a time
  static constexpr int kDQSplits = kHeadDim / kDQ;

  using MmaAtom = typename Sm80Mma<Element>::Atom;
  using Warps2x4 = TiledMMA<MmaAtom, Layout<Shape<_2, _4, _1>>, Tile<_32, _64, _16>>;
  using Warps4x2 = TiledMMA<MmaAtom, Layout<Shape<_4, _2, _1>>, Tile<_64, _32, _16>>;
  // S = Q K^T and dP = dO V^T, [kBlockM, kBlockN]: 2 warps along M x 4 along N (4 x 2 for 32-key tiles).
  using TiledMmaSdP = conditional_t<kBlockN >= 64, Warps2x4, Warps4x2>;
  // dV = P^T dO and dK = dS^T Q, [kBlockN, kHeadDim]: 4 warps along N x 2 along D (2 x 4 for 32-key tiles).
  using TiledMmaDKV = conditional_t<kBlockN >= 64, Warps4x2, Warps2x4>;
  // dQ = dS K, [kBlockM, kDQ]: 2 warps along M x 4 along D; at head dim 96, which is not whole 64-column
  // tiles (each warp reads 16 columns of K^T per ldmatrix.x4), 4 along M x 2 along D.
  using TiledMmaDQ = conditional_t<kDQ % 64 == 0, Warps2x4, Warps4x2>;

  using SmemLayoutQ = typename Base::template SmemLayoutRows<kBlockM>;          // Q, dO   [kBlockM, D]
  using SmemLayoutK = typename Base::template SmemLayoutRows<kBlockN>;          // K, V    [kBlockN, D]
  using SmemLayoutP = typename Base::template SmemLayoutTile<kBlockM, kBlockN>;  // P, dS   [kBlockM, kBlockN]
  // Transposed views of the same bytes (read with ldmatrix.trans): Q^T, dO^T [D, kBlockM]; K^T [D, kBlockN];
  // P^T, dS^T [kBlockN, kBlockM].
  using SmemLayoutQt =
      decltype(composition(SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>>{}, GenRowMajor{})));
  // K^T [kDQ, kBlockN] of one dQ slice: its columns of K are the tile at kBlockN * kDQ elements per slice.
  using SmemLayoutKt = decltype(composition(typename Base::template SmemLayoutTile<kBlockN, kDQ>{},
                                            make_layout(Shape<Int<kDQ>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutPt =
      decltype(composition(SmemLayoutP{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>>{}, GenRowMajor{})));

  // Shared memory of one CTA. Q, dO and the per-row data of a Q tile are double buffered (but at head dim 512) so
  // the next tile loads while the current one computes; the rows' token ids are staged once the current tile's mask
  // is evaluated, so one buffer serves. The big arrays come first, so each starts 1024-byte aligned (the
  // swizzle period) while the struct asks for only 128: D = 128 with block_kv = 128 then fits the 163 KB
  // an A100 grants one block.
  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 128> q[kQBuffers];
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 128> dout[kQBuffers];
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 128> k;     // reused for dK in the epilogue
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 128> v;     // reused for dV in the epilogue
    cute::array_aligned<Element, cosize_v<SmemLayoutP>, 128> p;
    cute::array_aligned<Element, cosize_v<SmemLayoutP>, 128> ds;
    cute::array_aligned<float, kBlockM, 16> lse2[kQBuffers];  // lse * log2(e); +inf for empty or padded rows
    cute::array_aligned<float, kBlockM, 16> dsum[kQBuffers];  // rowsum(dO * O); 0 for padded rows
    int q_ids[2 * kBlockM];                            // token ids [doc, grp] of the tile's query rows
    int k_ids[2 * kBlockN];                            // token ids [doc, grp] of the CTA's keys
    QTile tiles[2];                                    // the walk's next tiles, by buffer
    WalkCursor cursor;                                 // the walk's position after tiles[]
  };
  static constexpr int kSmemBytes = sizeof(SharedStorage);
};

}  // namespace omni::bwd
