// Compile-time configuration of the sm_80 kernels: MMA atoms, swizzled shared-memory layouts and the
// tiled copies between global memory, shared memory and registers.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace omni {

using namespace cute;

// mma.sync m16n8k16 with fp32 accumulation for each input type.
template <typename Element>
struct Sm80Mma;
template <>
struct Sm80Mma<cutlass::half_t> {
  using Atom = MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>;
};
template <>
struct Sm80Mma<cutlass::bfloat16_t> {
  using Atom = MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>;
};

// Pieces every sm_80 attention kernel shares: a warp-row tiled MMA, the swizzled smem atoms (conflict-free for
// cp.async writes and ldmatrix reads), and 16-byte gmem copies.
template <typename Element_, int kHeadDim_, int kNWarps_>
struct Sm80Base {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0, "head dim must be a multiple of 32");

  // Warps stacked along M; each MMA atom covers 16 rows, so a warp owns rows w*16 + 16*kNWarps*i.
  using TiledMma =
      TiledMMA<typename Sm80Mma<Element>::Atom, Layout<Shape<Int<kNWarps>, _1, _1>>, Tile<Int<16 * kNWarps>, _16, _16>>;

  // 8 rows of 64 elements (128 bytes): Swizzle<3,3,3> permutes the eight 16-byte chunks of a row by row. A tile
  // takes it where it divides the tile's columns, else (head dim 96, 32-key tiles) the same of 32 elements (64
  // bytes), whose four chunks Swizzle<2,3,3> permutes.
  using SmemLayoutAtom = decltype(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
  using SmemLayoutAtom32 = decltype(composition(Swizzle<2, 3, 3>{}, Layout<Shape<_8, _32>, Stride<_32, _1>>{}));
  template <int kCols>
  using SmemLayoutAtomOf = conditional_t<kCols % 64 == 0, SmemLayoutAtom, SmemLayoutAtom32>;
  using SmemLayoutAtomHeadDim = SmemLayoutAtomOf<kHeadDim>;
  static constexpr int kSmemRowElems = kHeadDim % 64 == 0 ? 64 : 32;

  // ldmatrix: x4 for row-major operands, x4.trans to read V as the B operand of P.V.
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  // Accumulator fragments (converted to Element) into smem for the epilogue.
  using SmemCopyAtomAcc = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // gmem tiles move 16 bytes per thread per copy; a row chunk of one atom takes 8 (or 4) threads.
  static constexpr int kGmemThreadsPerRow = kSmemRowElems / 8;
  using GmemThreadLayout =
      Layout<Shape<Int<kNThreads / kGmemThreadsPerRow>, Int<kGmemThreadsPerRow>>, Stride<Int<kGmemThreadsPerRow>, _1>>;
  // cp.async with zero fill: a false predicate writes zeros and reads nothing.
  using GmemTiledLoad = decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element>{},
                                                 GmemThreadLayout{}, Layout<Shape<_1, _8>>{}));
  using GmemTiledStore = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{}, GmemThreadLayout{},
                                                  Layout<Shape<_1, _8>>{}));

  // A [kRows, kCols] tile in smem. The atoms tile the rows first, so the columns from a multiple of 64 on are a
  // tile of the same layout a whole number of atoms (a multiple of the swizzle's period) further on.
  template <int kRows, int kCols>
  using SmemLayoutTile = decltype(tile_to_shape(SmemLayoutAtomOf<kCols>{}, Shape<Int<kRows>, Int<kCols>>{}));
  // A [rows, kHeadDim] tile in smem.
  template <int kRows>
  using SmemLayoutRows = SmemLayoutTile<kRows, kHeadDim>;
};

// The forward: a CTA owns kBlockM query rows (= the mask's block_q) and walks kBlockN-key tiles. Above head dim 256
// a CTA computes kHeadDimV = 256 columns of the output (kVSplits CTAs per tile of rows, each computing the whole
// Q K^T): a warp's 16 rows of a 512-wide accumulator would take 256 registers per thread.
template <typename Element, int kHeadDim, int kBlockM_, int kBlockN_, int kNWarps>
struct FwdTraits : Sm80Base<Element, kHeadDim, kNWarps> {
  using Base = Sm80Base<Element, kHeadDim, kNWarps>;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kHeadDimV = kHeadDim > 256 ? 256 : kHeadDim;
  static constexpr int kVSplits = kHeadDim / kHeadDimV;
  static_assert(kBlockM % (16 * kNWarps) == 0, "kBlockM must be a multiple of the MMA tile's rows");
  static_assert(kHeadDim % kHeadDimV == 0, "the output's column slices must tile the head dim");

  using SmemLayoutQ = typename Base::template SmemLayoutRows<kBlockM>;
  using SmemLayoutKV = typename Base::template SmemLayoutRows<kBlockN>;
  // The CTA's columns of V and of the output (staged in Q's space).
  using SmemLayoutV = typename Base::template SmemLayoutTile<kBlockN, kHeadDimV>;
  using SmemLayoutO = typename Base::template SmemLayoutTile<kBlockM, kHeadDimV>;
  // V viewed as [kHeadDimV, kBlockN] (the B operand of P.V), with and without the swizzle.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutV{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockN>>{}, GenRowMajor{})));
  using SmemLayoutVtPlain = decltype(get_nonswizzle_portion(SmemLayoutVt{}));

  // Shared memory: Q (reused for the output), K, V, the token ids of the rows, and the per-tile mask data
  // (the columns' token ids or the tile's pool rows, tile_aux.cuh).
  static constexpr int kPoolWords = kBlockN / 32;
  static constexpr int kAuxInts = 2 * kBlockN > kBlockM* kPoolWords ? 2 * kBlockN : kBlockM * kPoolWords;
  static constexpr int kSmemQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kSmemKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kSmemVBytes = kBlockN * kHeadDimV * sizeof(Element);
  static constexpr int kSmemQIdsOffset = kSmemQBytes + kSmemKBytes + kSmemVBytes;
  static constexpr int kSmemAuxOffset = kSmemQIdsOffset + 2 * kBlockM * sizeof(int);
  static constexpr int kSmemBytes = kSmemAuxOffset + kAuxInts * sizeof(int);
};

}  // namespace omni
