// Warpgroup MMA (wgmma) issue, the register views of its accumulators that softmax and P.V need, and their stores
// into swizzled shared memory.
#pragma once
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/tensor.hpp>

namespace omni::sm90 {

using namespace cute;

// wgmma reads its shared-memory descriptors from uniform registers. Where they derive from a value the compiler
// does not know to be the same in every lane (the thread index, a loop counter it keeps in a per-thread register),
// ptxas computes them per thread and moves both words of each into uniform registers (R2UR) before every wgmma:
// about 50 R2UR per warp and tile in the backward. These two make the values that select an operand warp-uniform.

// `x`, known to the compiler to be the same in every lane of the warp (lane 0's, shuffled).
__forceinline__ __device__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

// The slice of `mma` that partitions its shared-memory operands for warpgroup `wg` (warp-uniform: e.g.
// cutlass::canonical_warp_group_idx()); their descriptors are the same for all of its threads. Accumulators are
// partitioned by the thread's own slice.
template <class TiledMma>
__forceinline__ __device__ auto warpgroup_slice(const TiledMma& mma, int wg) {
  return mma.get_thread_slice(wg * 128);
}

// Issues C (+)= A B over every k block as one wgmma batch and commits it. The caller waits with
// warpgroup_wait<N>() before reading C, so independent work can run while the tensor cores do.
// A comes from registers (RS) or smem descriptors (SS); kZeroInit skips reading C's old value.
template <bool kZeroInit, class TiledMma, class TA, class TB, class TC>
__forceinline__ __device__ void gemm_issue(TiledMma& mma, const TA& a, const TB& b, TC& c) {
  constexpr bool kRegisterA = !is_base_of<GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kRegisterA) warpgroup_fence_operand(const_cast<TA&>(a));
}

// Waits until at most kPending committed wgmma batches of this warpgroup are still in flight.
template <int kPending, class TC>
__forceinline__ __device__ void gemm_wait(TC& c) {
  warpgroup_wait<kPending>();
  warpgroup_fence_operand(c);
}

// Stores `frag`, a fragment shaped like `mma`'s accumulator (already converted to 16-bit elements), into `smem`, a
// swizzled shared-memory tile of the accumulator's shape, by stmatrix: four 8 x 8 blocks per instruction, at
// shared-window addresses. (Through CuTe's swizzled-pointer view of the tile, ptxas emitted a 64-bit generic
// store for every 32-bit pair, each with five instructions of address arithmetic.) `thread`: the index `mma`'s
// thread slice was taken with.
template <class TiledMma, class TF, class TS>
__forceinline__ __device__ void store_accumulator(const TiledMma& mma, int thread, const TF& frag, TS&& smem) {
  using Element = typename remove_cvref_t<TF>::value_type;
  static_assert(sizeof(Element) == 2, "stmatrix stores 16-bit elements");
  const auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
  const auto thr = r2s.get_thread_slice(thread);
  copy(r2s, thr.retile_S(frag), thr.partition_D(as_position_independent_swizzle_tensor(smem)));
}

// ((2, 2, V), MMA_M, MMA_N) wgmma accumulator -> ((2, MMA_M), (2, V, MMA_N)) = (rows, cols) of this thread.
// Mode 0 is (column pair, row + 8, 8-column chunk); like mma.sync, a row is spread over a quad of threads.
template <class Layout>
__forceinline__ __device__ auto rowcol_layout(Layout layout) {
  static_assert(decltype(rank(layout))::value == 3, "expected an (MMA, MMA_M, MMA_N) layout");
  auto l = get<0>(layout);
  return make_layout(make_layout(get<1>(l), get<1>(layout)), make_layout(get<0>(l), get<2>(l), get<2>(layout)));
}

template <class Tensor>
__forceinline__ __device__ auto rowcol(Tensor&& t) {
  return make_tensor(t.data(), rowcol_layout(t.layout()));
}

// The accumulator of S as the register A operand of P.V: two neighbouring 8-column chunks of S hold exactly
// the registers of one k16 slice of A, so the same (converted) registers are only re-viewed.
template <class Layout>
__forceinline__ __device__ auto acc_as_a_operand_layout(Layout layout) {
  auto l = logical_divide(get<0>(layout), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, V / 2))
  return make_layout(make_layout(get<0>(l), get<1>(l), get<2, 0>(l)), get<1>(layout),
                     make_layout(get<2, 1>(l), get<2>(layout)));
}

}  // namespace omni::sm90
