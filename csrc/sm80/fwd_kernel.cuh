// The sm_80 forward: one CTA per (query tile = mask Q block, head, batch) walks only the active key tiles of
// its block row. Per tile (FlashAttention-2 order, single K and V buffers):
//   wait K(t) | issue V(t) | PARTIAL: rule -> bits | S = Q K^T | softcap, bias, mask by kind | wait V(t) |
//   issue K(t+1) + its mask data | online softmax | O += P V
// so the next K loads during the softmax and P.V, and V(t) during Q.K^T. Loop-carried scalars are kept few:
// pointers come from the __grid_constant__ params and per-thread partitions are rebuilt from
// fresh_thread_idx() inside the loop, so the accumulators keep the registers (thread_index.cuh).
#pragma once
#include <cute/tensor.hpp>

#include "common/bias.cuh"
#include "common/fragment.cuh"
#include "sm80/kernel_traits.cuh"
#include "common/kv_tiles.cuh"
#include "sm80/mma.cuh"
#include "omni_attention.h"
#include "common/softmax.cuh"
#include "common/thread_index.cuh"
#include "common/tile_aux.cuh"
#include "common/tile_copy.cuh"
#include "common/tile_mask.cuh"

namespace omni {

using namespace cute;

// A [kRows, kCols] view of tensor t at (b, h), starting at row `row0` and column `col0`.
template <typename Element, int kRows, int kCols>
__forceinline__ __device__ auto gmem_tile(const OmniTensor& t, int b, int h, int row0, int col0 = 0) {
  Element* ptr = static_cast<Element*>(t.ptr) + b * t.stride_b + h * t.stride_h + int64_t(row0) * t.stride_s + col0;
  return make_tensor(make_gmem_ptr(ptr), Shape<Int<kRows>, Int<kCols>>{}, make_stride(t.stride_s, _1{}));
}

// Stages what the rule of a PARTIAL tile reads (its columns' token ids or its pool rows) into s_aux.
template <class Traits>
__forceinline__ __device__ void stage_tile_aux(int* s_aux, const KvTile& tile, const OmniFwdParams& p, int b, int tid) {
  const OmniMask& m = p.mask;
  if (tile.kind == kTileToken) {
    stage_token_ids<Traits::kBlockN, Traits::kNThreads>(s_aux, batch_ids(m.doc_ids, m.ids_stride_b, b),
                                                        batch_ids(m.group_ids, m.ids_stride_b, b), tile.col0, p.kv_len,
                                                        tid);
  } else if (tile.kind == kTilePool) {
    stage_pool_rows<Traits::kBlockM, Traits::kPoolWords, Traits::kNThreads>(s_aux, m, tile.pool, 0,
                                                                            tile.col0 & (m.block_kv - 1), tid);
  }
}

// Evaluates the rule of a PARTIAL tile into bits (one per score fragment element) from the staged data.
template <class Traits, class Bits, class TC>
__forceinline__ __device__ void partial_tile_bits(Bits& bits, const TC& c, const KvTile& tile, const OmniFwdParams& p,
                                                  int qpos0, const int* s_q_ids, const int* s_aux) {
  if (tile.kind == kTileToken) {
    token_bits<Traits::kBlockM, Traits::kBlockN>(bits, c, s_q_ids, s_aux, qpos0, tile.col0, p.mask);
  } else if (tile.kind == kTilePool) {
    pool_bits(bits, c, staged_pool_view<Traits::kBlockM, Traits::kPoolWords>(s_aux), p.kv_len - tile.col0);
  }
}

// Masks the score fragment s by tile kind; FULL tiles do nothing, PARTIAL tiles apply their bits.
template <class TS, class TC, class Bits>
__forceinline__ __device__ void mask_tile(TS& s, const TC& c, const KvTile& tile, const Bits& bits,
                                          const OmniFwdParams& p, int qpos0) {
  switch (tile.kind) {
    case kTileFull:
      break;
    case kTileColLimit:
      mask_col_limit(s, c, p.kv_len - tile.col0);
      break;
    case kTileCausal:
      mask_causal(s, c, qpos0, tile.col0);
      break;
    default:
      bits.apply(s);
      break;
  }
}

template <class Traits, bool kSoftcap>
__global__ void __launch_bounds__(Traits::kNThreads) fwd_kernel(const __grid_constant__ OmniFwdParams p) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kHeadDimV = Traits::kHeadDimV;
  constexpr int kNThreads = Traits::kNThreads;
  using Walker = KvTileWalker<kBlockN>;

  extern __shared__ __align__(1024) char smem[];
  const int tid = threadIdx.x;
  const int h = blockIdx.x / Traits::kVSplits;
  const int v_col0 = blockIdx.x % Traits::kVSplits * kHeadDimV;  // the first of this CTA's output columns
  const int q_block = gridDim.y - 1 - blockIdx.y;  // later query blocks see more keys: launch them first
  const int b = blockIdx.z;
  const int row0 = q_block * kBlockM;
  const int qpos0 = row0 + p.kv_len - p.q_len;  // bottom-right alignment
  const int h_kv = h / (p.heads_q / p.heads_kv);

  const Walker walker(p.mask, b, p.mask.heads == 1 ? 0 : h, q_block, qpos0, p.kv_len);
  const int n_tiles = walker.num_tiles(p.mask.block_kv);

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
  Tensor sVtPlain = make_tensor(sV.data(), typename Traits::SmemLayoutVtPlain{});
  int* s_q_ids = reinterpret_cast<int*>(smem + Traits::kSmemQIdsOffset);
  int* s_aux = reinterpret_cast<int*>(smem + Traits::kSmemAuxOffset);

  // gmem -> smem copies of kRows x kCols tiles from column c0, rows past the ends and columns past head_dim
  // zero-filled (tile_copy.cuh).
  typename Traits::GmemTiledLoad load_op;
  auto load_tile = [&](auto rows, auto cols, const OmniTensor& src, int h_src, int row_start, int row_end, int c0,
                       auto& dst) {
    constexpr int kRows = decltype(rows)::value;
    constexpr int kCols = decltype(cols)::value;
    auto thr = load_op.get_thread_slice(fresh_thread_idx());
    auto g = gmem_tile<Element, kRows, kCols>(src, b, h_src, row_start, c0);
    load_rows<kRows, kCols>(load_op, thr.partition_S(g), thr.partition_D(dst),
                            thr.partition_S(make_identity_tensor(Shape<Int<kRows>, Int<kCols>>{})), row_end - row_start,
                            p.head_dim - c0);
  };
  auto load_k = [&](int col0) { load_tile(Int<kBlockN>{}, Int<kHeadDim>{}, p.k, h_kv, col0, p.kv_len, 0, sK); };
  auto load_v = [&](int col0) { load_tile(Int<kBlockN>{}, Int<kHeadDimV>{}, p.v, h_kv, col0, p.kv_len, v_col0, sV); };

  // MMA fragments; the ldmatrix partitions of smem and the score coordinates are rebuilt per use.
  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(sK);
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtPlain);
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kHeadDimV>>{});
  clear(acc_o);
  const auto cS = make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{});
  auto score_coords = [&] { return mma.get_thread_slice(fresh_thread_idx()).partition_C(cS); };
  auto copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma);
  auto copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma);
  auto ldsm_src = [](const auto& copy_op, const auto& s) {
    return copy_op.get_thread_slice(fresh_thread_idx()).partition_S(s);
  };

  // Prologue: Q, the rows' token ids, the first K tile and its mask data.
  KvTile tile{};
  KvEntry next_entry{};
  if (n_tiles > 0) {
    load_tile(Int<kBlockM>{}, Int<kHeadDim>{}, p.q, h, row0, p.q_len, 0, sQ);
    stage_token_ids<kBlockM, kNThreads>(s_q_ids, batch_ids(p.mask.doc_ids, p.mask.ids_stride_b, b),
                                        batch_ids(p.mask.group_ids, p.mask.ids_stride_b, b), qpos0, p.kv_len, tid);
    tile = Walker::decode(walker.fetch(p.mask, 0, qpos0, p.kv_len), 0, p.mask.block_kv, p.kv_len);
    load_k(tile.col0);
    stage_tile_aux<Traits>(s_aux, tile, p, b, tid);
    cp_async_fence();
    if (n_tiles > 1) next_entry = walker.fetch(p.mask, 1, qpos0, p.kv_len);
  }

  const float scale_log2 = softmax_scale_log2(p, kSoftcap);
  OnlineSoftmax<decltype(size<0>(rowcol(acc_o)))::value> softmax;
  for (int t = 0; t < n_tiles; ++t) {
    cp_async_wait<0>();
    __syncthreads();  // K(t) and its mask data visible; every warp done with V(t-1)
    load_v(tile.col0);
    cp_async_fence();

    FragmentBits<decltype(size(score_coords()))::value> bits;
    partial_tile_bits<Traits>(bits, score_coords(), tile, p, qpos0, s_q_ids, s_aux);
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    gemm_ss(acc_s, tSrQ, tSrK, ldsm_src(copy_q, sQ), ldsm_src(copy_k, sK), mma, copy_q, copy_k);
    if constexpr (kSoftcap) apply_softcap(acc_s, p.scale / p.softcap);
    if (p.bias.ptr != nullptr) {
      add_bias(acc_s, score_coords(), p.bias, b, h, row0, tile.col0, p.q_len, p.kv_len, 1.f / p.scale);
    }
    mask_tile(acc_s, score_coords(), tile, bits, p, qpos0);

    cp_async_wait<0>();
    __syncthreads();  // V(t) visible; every warp done with K(t) and the mask data of tile t
    if (t + 1 < n_tiles) {
      tile = Walker::decode(next_entry, t + 1, p.mask.block_kv, p.kv_len);
      load_k(tile.col0);
      stage_tile_aux<Traits>(s_aux, tile, p, b, fresh_thread_idx());
      cp_async_fence();
      if (t + 2 < n_tiles) next_entry = walker.fetch(p.mask, t + 2, qpos0, p.kv_len);
    }

    auto s_rc = rowcol(acc_s);
    auto o_rc = rowcol(acc_o);
    softmax.update(s_rc, o_rc, scale_log2);
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand_layout(rP.layout()));
    gemm_rs(acc_o, tOrP, tOrVt, ldsm_src(copy_v, sVt), mma, copy_v);
  }

  // Epilogue: normalise, stage O through smem (reusing Q's space), store 16-byte rows and (one CTA of the row
  // tile's) the LSE.
  float lse[decltype(size<0>(rowcol(acc_o)))::value];
  auto o_rc = rowcol(acc_o);
  softmax.finalize(o_rc, scale_log2, lse, sink_log2(p, h));
  Tensor rO = convert_fragment<Element>(acc_o);
  auto copy_o = make_tiled_copy_C(typename Traits::SmemCopyAtomAcc{}, mma);
  cp_async_wait<0>();
  __syncthreads();  // nobody reads Q any more
  Tensor sO = make_tensor(sQ.data(), typename Traits::SmemLayoutO{});
  copy(copy_o, retile(copy_o, rO), copy_o.get_thread_slice(tid).partition_D(sO));
  __syncthreads();
  typename Traits::GmemTiledStore store_op;
  auto store_thr = store_op.get_thread_slice(tid);
  auto gO = gmem_tile<Element, kBlockM, kHeadDimV>(p.out, b, h, row0, v_col0);
  store_rows(store_op, store_thr.partition_S(sO), store_thr.partition_D(gO),
             store_thr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimV>>{})), p.q_len - row0,
             p.head_dim - v_col0);

  if (v_col0 == 0) {
    auto c_rc = rowcol(thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDimV>>{})));
    store_lse(c_rc, lse, p.lse + (int64_t(b) * p.heads_q + h) * p.q_len + row0, p.q_len - row0);
  }
}

}  // namespace omni
