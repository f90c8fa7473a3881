// The sm_90a forward. A work item is a (query tile of kBlockM rows, head, batch); its CTA walks the active key
// tiles of the mask's block row holding its rows (kv_tiles.cuh), like the sm_80 kernel, but with Hopper's engines.
// 128- and 192-row CTAs are persistent up to head dim 128: one per SM, each taking items from a work counter (in
// the workspace) until none is left, the next item's Q and first tiles loading while the current one finishes;
// the others take one item each (tile_scheduler.cuh).
//   warpgroup 0 (producer, one warp): TMA loads of Q per item and of K, V per tile into a kStages-deep ring of
//     swizzled smem buffers completing on mbarriers; cp.async of the tile's mask data (column token ids or
//     pool rows) arriving on the same barrier as K; the decoded tile descriptor beside it. Where the token rule's
//     rows are ranges (tile_aux.cuh), the query rows' ranges come with Q and token tiles need no column data.
//   warpgroups 1 (, 2, 3) (consumers, 64 query rows each): S = Q K^T by wgmma from smem, mask by tile kind (FULL
//     tiles run no mask code), online softmax in registers, O += P V by wgmma with P from registers.
// setmaxnreg moves registers from the producer to the consumers. Within a consumer warpgroup the softmax of
// one tile overlaps the GEMMs of its neighbours; across two or three, named barriers take turns at the GEMM issue.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "common/bias.cuh"
#include "common/fragment.cuh"
#include "common/kv_tiles.cuh"
#include "omni_attention.h"
#include "sm90/fwd_traits.cuh"
#include "sm90/softmax_deferred.cuh"
#include "sm90/sync.cuh"
#include "sm90/tile_mask_token.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/tma.cuh"
#include "sm90/wgmma.cuh"
#include "common/softmax.cuh"
#include "common/thread_index.cuh"
#include "common/tile_aux.cuh"
#include "common/tile_copy.cuh"
#include "common/tile_mask.cuh"

namespace omni::sm90 {

using namespace cute;

// The kernel's parameters: the ABI's params and the TMA descriptors of q, k, v (built by fwd_launch.cuh).
template <class Traits>
struct FwdParams {
  using Element = typename Traits::Element;
  using TmaQ = decltype(make_tma_load<Element>(OmniTensor{}, 1, 1, 1, 1, typename Traits::SmemLayoutQ{}));
  using TmaKV = decltype(make_tma_load<Element>(OmniTensor{}, 1, 1, 1, 1, take<0, 2>(typename Traits::SmemLayoutK{})));
  OmniFwdParams p;
  TmaQ tma_q;
  TmaKV tma_k, tma_v;
  int fold;     // FwdTileScheduler's launch order: the linear CTA index from which ranks run backwards (0: never)
  int section;  // FwdTileScheduler's (batch, head) pairs per L2 section (fwd_l2_section)
};

// Named barrier ids (0 is __syncthreads): one per consumer warpgroup (up to three) for its epilogue.
constexpr int kEpilogueBarrier = 1;

// A CTA's query rows: its tile of q and where that tile sits in the mask's Q block (which may be taller).
struct QTile {
  int index;        // of the tile along q (kBlockM rows each)
  int row0;         // its first row in q
  int qpos0;        // absolute position of its first row (bottom-right alignment)
  int block;        // the mask's Q block holding it
  int block_qpos0;  // absolute position of that block's first row
};

__forceinline__ __device__ QTile make_q_tile(int index, int block_m, const OmniFwdParams& p) {
  const int row0 = index * block_m;
  const int block = row0 / p.mask.block_q;
  const int offset = p.kv_len - p.q_len;
  return {index, row0, row0 + offset, block, block * p.mask.block_q + offset};
}

// Producer warp, one work item: Q and its rows' token ids or ranges once, then the item's K, V tiles in order, a
// stage at a time as consumers free them; the ring continues across items (g0: how many tiles went through it).
template <class Traits, class Params, class Storage>
__forceinline__ __device__ void produce(const Params& params, Storage& s, int b, int h, int h_kv, const QTile& qt,
                                        const KvTileWalker<Traits::kBlockN>& walker, int n_tiles, bool ranged, int g0) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  const OmniFwdParams& p = params.p;
  const OmniMask& m = p.mask;
  const int lane = threadIdx.x % 32;
  const int* doc = batch_ids(m.doc_ids, m.ids_stride_b, b);
  const int* grp = batch_ids(m.group_ids, m.ids_stride_b, b);

  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(s.k), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(s.v), typename Traits::SmemLayoutV{});
  Tensor mQ = params.tma_q.get_tma_tensor(make_shape(p.q_len, p.head_dim, p.heads_q, p.batch));
  Tensor mK = params.tma_k.get_tma_tensor(make_shape(p.kv_len, p.head_dim, p.heads_kv, p.batch));
  Tensor mV = params.tma_v.get_tma_tensor(make_shape(p.kv_len, p.head_dim, p.heads_kv, p.batch));
  Tensor gQ = local_tile(mQ(_, _, h, b), Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(qt.index, _0{}));
  Tensor gK = local_tile(mK(_, _, h_kv, b), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
  Tensor gV = local_tile(mV(_, _, h_kv, b), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));
  auto [tQg, tQs] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto [tKg, tKs] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVg, tVs] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

  if (lane == 0) {
    Barrier::arrive_and_expect_tx(&s.q_full, Traits::kQBytes);
    copy(params.tma_q.with(s.q_full), tQg, tQs);
  }
  if (ranged) {
    stage_token_ranges<kBlockM, 32, false>(s.q_ids, m, b, qt.qpos0, p.kv_len, lane);
  } else {
    stage_token_ids<kBlockM, 32>(s.q_ids, doc, grp, qt.qpos0, p.kv_len, lane);
  }
  arrive_after_staging(&s.q_full);

  for (int t = 0; t < n_tiles; ++t) {
    const int g = g0 + t;
    const int stage = g % Traits::kStages;
    const int free_phase = ((g / Traits::kStages) & 1) ^ 1;  // a fresh barrier counts as freed once
    Barrier::wait(&s.k_empty[stage], free_phase);
    KvTile tile = KvTileWalker<kBlockN>::decode(walker.fetch(m, t, qt.block_qpos0, p.kv_len), t, m.block_kv, p.kv_len);
    if (ranged && tile.kind == kTileToken) tile.kind = kTileTokenRanges;
    const int n = tile.col0 / kBlockN;
    if (lane == 0) {
      s.tile[stage] = tile;
      Barrier::arrive_and_expect_tx(&s.k_full[stage], Traits::kTileBytes);
      copy(params.tma_k.with(s.k_full[stage]), tKg(_, n), tKs(_, stage));
    }
    if (tile.kind == kTileToken) {
      stage_token_ids<kBlockN, 32>(s.aux[stage], doc, grp, tile.col0, p.kv_len, lane);
    } else if (tile.kind == kTilePool) {
      stage_pool_rows<kBlockM, Traits::kPoolWords, 32>(s.aux[stage], m, tile.pool, qt.row0 - qt.block * m.block_q,
                                                       tile.col0 & (m.block_kv - 1), lane);
    }
    arrive_after_staging(&s.k_full[stage]);
    Barrier::wait(&s.v_empty[stage], free_phase);
    if (lane == 0) {
      Barrier::arrive_and_expect_tx(&s.v_full[stage], Traits::kTileBytes);
      copy(params.tma_v.with(s.v_full[stage]), tVg(_, n), tVs(_, stage));
    }
  }
}

// Masks the score fragment by tile kind from the staged mask data; FULL tiles never get here. q_ids: the query
// rows' token ranges for kTileTokenRanges (the producer staged them), else their ids.
template <class Traits, class TS, class TC>
__forceinline__ __device__ void mask_scores(TS& acc_s, const TC& c, const KvTile& tile, const OmniFwdParams& p,
                                            int qpos0, const int* q_ids, const int* aux) {
  switch (tile.kind) {
    case kTileColLimit:
      mask_col_limit(acc_s, c, p.kv_len - tile.col0);
      break;
    case kTileCausal:
      mask_causal(acc_s, c, qpos0, tile.col0);
      break;
    case kTileToken: {
      auto s_rc = rowcol(acc_s);
      mask_token_rule<Traits::kBlockM, Traits::kBlockN>(s_rc, rowcol(c), q_ids, aux, qpos0, tile.col0, p.mask);
      break;
    }
    case kTileTokenRanges: {
      auto s_rc = rowcol(acc_s);
      mask_token_ranges(s_rc, rowcol(c), q_ids, tile.col0);
      break;
    }
    default: {
      FragmentBits<decltype(size(acc_s))::value> bits;
      pool_bits(bits, c, staged_pool_view<Traits::kBlockM, Traits::kPoolWords>(aux), p.kv_len - tile.col0);
      bits.apply(acc_s);
    }
  }
}

// Warpgroup ping-pong: a consumer warpgroup issues its GEMMs only in its turn and then passes the turn to the
// next one (round robin over two or three), so the tensor cores run one warpgroup's GEMMs while the others do
// their softmax. One barrier per warpgroup, after the epilogue's.
constexpr int kSchedulerBarrier = kEpilogueBarrier + 3;

// Consumer warpgroups: the attention of their 64 query rows, then the epilogue. Per tile t (FlashAttention-3's
// intra-warpgroup overlap): issue S(t) = Q K(t)^T, rescale O, issue O += P(t-1) V(t-1); wait for S(t), mask it
// and run its softmax while P.V still runs; wait for P.V. Stages are released as soon as their GEMM is done
// (K after S(t) and its mask data are read, V after P.V).
template <class Traits, bool kSoftcap, class Storage>
__forceinline__ __device__ void consume(const OmniFwdParams& p, Storage& s, int b, int h, int row0, int qpos0,
                                        int n_tiles, int g0) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  const int ctid = threadIdx.x - 128;  // 0 .. kConsumerThreads - 1
  const int wg = cutlass::canonical_warp_group_idx() - 1;  // warp-uniform: selects wgmma operands (wgmma.cuh)

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_pv = mma_pv.get_thread_slice(ctid);
  auto wg_qk = warpgroup_slice(mma_qk, wg);
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(s.k), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(s.v), typename Traits::SmemLayoutVt{});
  Tensor tSrQ = wg_qk.partition_fragment_A(sQ);
  Tensor tSrK = wg_qk.partition_fragment_B(sK);
  Tensor tOrVt = warpgroup_slice(mma_pv, wg).partition_fragment_B(sVt);
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});
  clear(acc_o);
  Tensor acc_s = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
  Tensor rP = make_tensor<Element>(acc_s.layout());
  Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand_layout(rP.layout()));
  auto s_rc = rowcol(acc_s);
  auto o_rc = rowcol(acc_o);

  const float scale_log2 = softmax_scale_log2(p, kSoftcap);
  constexpr int kRows = decltype(size<0>(o_rc))::value;
  DeferredSoftmax<kRows> softmax;
  float rescale[kRows];

  // The turn starts with warpgroup 0. The last warpgroup gives it the first turn and passes it on after every
  // turn but its last, so every arrive meets a sync and no barrier is left half-way at exit.
  const bool last_wg = wg == Traits::kConsumerWGs - 1;
  const int next = kSchedulerBarrier + (last_wg ? 0 : wg + 1);
  if (Traits::kPingPong && last_wg && n_tiles > 0) named_barrier_arrive(kSchedulerBarrier, 2 * 128);
  auto scores = [&](int t, int stage) {  // issue S(t) in this warpgroup's turn; returns the tile
    Barrier::wait(&s.k_full[stage], ((g0 + t) / kStages) & 1);
    if constexpr (Traits::kPingPong) named_barrier_sync(kSchedulerBarrier + wg, 2 * 128);
    gemm_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, stage), acc_s);
    return s.tile[stage];
  };
  auto pass_turn = [&](int t) {
    if (Traits::kPingPong && (!last_wg || t + 1 < n_tiles)) named_barrier_arrive(next, 2 * 128);
  };
  auto mask_and_softmax = [&](int t, const KvTile& tile, int stage) {  // S(t) has landed
    if constexpr (kSoftcap) apply_softcap(acc_s, p.scale / p.softcap);
    if (p.bias.ptr != nullptr) {
      const Tensor cS = mma_qk.get_thread_slice(unhoisted(ctid))
                            .partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
      add_bias(acc_s, cS, p.bias, b, h, row0, tile.col0, p.q_len, p.kv_len, 1.f / p.scale);
    }
    if (tile.kind != kTileFull) {
      // Derived here from an unhoisted ctid: from the plain one, the coordinates were hoisted out of the tile loop
      // and kept live across it (a register per key column of the thread), which spilled the softmax state at 192
      // rows' 160 registers and cost 2-6% of causal forwards at 128 rows.
      const Tensor cS = mma_qk.get_thread_slice(unhoisted(ctid))
                            .partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
      mask_scores<Traits>(acc_s, cS, tile, p, qpos0, s.q_ids, s.aux[stage]);
    }
    Barrier::arrive(&s.k_empty[stage]);
    if (t == n_tiles - 1) Barrier::arrive(&s.q_empty);  // Q and its ids are no longer read
    softmax.update_scores(s_rc, scale_log2, rescale);
  };

  if (n_tiles == 0) {
    Barrier::arrive(&s.q_empty);
  } else {
    const KvTile tile = scores(0, g0 % kStages);
    pass_turn(0);
    gemm_wait<0>(acc_s);
    mask_and_softmax(0, tile, g0 % kStages);
    rP = convert_fragment<Element>(acc_s);
  }
  for (int t = 1; t < n_tiles; ++t) {
    const int stage = (g0 + t) % kStages;
    const int prev = (g0 + t - 1) % kStages;
    const KvTile tile = scores(t, stage);
    DeferredSoftmax<kRows>::rescale_output(o_rc, rescale);
    Barrier::wait(&s.v_full[prev], ((g0 + t - 1) / kStages) & 1);
    gemm_issue<false>(mma_pv, tOrP, tOrVt(_, _, _, prev), acc_o);
    pass_turn(t);
    gemm_wait<1>(acc_s);
    mask_and_softmax(t, tile, stage);
    gemm_wait<0>(acc_o);
    Barrier::arrive(&s.v_empty[prev]);
    rP = convert_fragment<Element>(acc_s);
  }
  if (n_tiles > 0) {
    const int last = (g0 + n_tiles - 1) % kStages;
    DeferredSoftmax<kRows>::rescale_output(o_rc, rescale);
    Barrier::wait(&s.v_full[last], ((g0 + n_tiles - 1) / kStages) & 1);
    gemm_issue<false>(mma_pv, tOrP, tOrVt(_, _, _, last), acc_o);
    gemm_wait<0>(acc_o);
    Barrier::arrive(&s.v_empty[last]);
  }

  // Epilogue: normalise, stage this warpgroup's 64 rows of O in its rows of the O buffer (after the previous
  // item's stores have read it), store 16-byte rows.
  float lse[kRows];
  softmax.finalize(o_rc, scale_log2, lse, sink_log2(p, h));
  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor sO_all = make_tensor(make_smem_ptr(Traits::kPersistent ? s.o : s.q), typename Traits::SmemLayoutQ{});
  if constexpr (Traits::kPersistent) named_barrier_sync(kEpilogueBarrier + wg, 128);
  copy(rO, thr_pv.partition_C(sO_all));
  named_barrier_sync(kEpilogueBarrier + wg, 128);

  constexpr int kPerRow = row_vector_threads<kHeadDim, 8>();
  using StoreThreads = Layout<Shape<Int<128 / kPerRow>, Int<kPerRow>>, Stride<Int<kPerRow>, _1>>;
  auto store_op =
      make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{}, StoreThreads{}, Layout<Shape<_1, _8>>{});
  auto store_thr = store_op.get_thread_slice(ctid % 128);
  const int wg_row0 = row0 + wg * 64;
  Tensor sO = local_tile(sO_all, Shape<_64, Int<kHeadDim>>{}, make_coord(wg, _0{}));
  Element* out =
      static_cast<Element*>(p.out.ptr) + b * p.out.stride_b + h * p.out.stride_h + int64_t(wg_row0) * p.out.stride_s;
  Tensor gO = make_tensor(make_gmem_ptr(out), Shape<_64, Int<kHeadDim>>{}, make_stride(p.out.stride_s, _1{}));
  store_rows(store_op, store_thr.partition_S(sO), store_thr.partition_D(gO),
             store_thr.partition_S(make_identity_tensor(Shape<_64, Int<kHeadDim>>{})), p.q_len - wg_row0, p.head_dim);

  auto c_rc = rowcol(thr_pv.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{})));
  store_lse(c_rc, lse, p.lse + (int64_t(b) * p.heads_q + h) * p.q_len + row0, p.q_len - row0);
}

template <class Traits, bool kSoftcap>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kCtasPerSm)
    fwd_kernel(const __grid_constant__ FwdParams<Traits> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Storage = typename Traits::SharedStorage;
  extern __shared__ __align__(1024) char smem[];
  Storage& s = *reinterpret_cast<Storage*>(smem);
  const OmniFwdParams& p = params.p;
  const FwdTileScheduler<Traits::kBlockM, Traits::kPersistent> scheduler(p, params.fold, params.section);

  if (threadIdx.x == 0) {
    Barrier::init(&s.q_full, kFullArrivals);
    Barrier::init(&s.q_empty, Traits::kConsumerThreads);
    for (int i = 0; i < Traits::kStages; ++i) {
      Barrier::init(&s.k_full[i], kFullArrivals);
      Barrier::init(&s.v_full[i], 1);
      Barrier::init(&s.k_empty[i], Traits::kConsumerThreads);
      Barrier::init(&s.v_empty[i], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // The producer publishes each item (its rank and tile count) with its Q; a rank past the work ends the CTA.
  if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      int64_t rank = scheduler.get_initial_work();
      int g = 0;
      for (int j = 0;; ++j) {
        // How the item's token tiles are masked depends on its batch row: read before waiting for Q's buffer.
        const bool ranged =
            scheduler.is_valid(rank) && token_ranges_apply(p.mask, scheduler.get_block_coord(rank).batch);
        Barrier::wait(&s.q_empty, (j & 1) ^ 1);
        const int64_t next = scheduler.get_next_work(rank, lane);
        if (!scheduler.is_valid(rank)) {
          if (lane == 0) {
            s.item = FwdItem{-1, 0};
            Barrier::arrive(&s.q_full);
          }
          arrive_after_staging(&s.q_full);
          break;
        }
        const CtaWork work = scheduler.get_block_coord(rank);
        const QTile qt = make_q_tile(work.tile, Traits::kBlockM, p);
        const KvTileWalker<Traits::kBlockN> walker(p.mask, work.batch, p.mask.heads == 1 ? 0 : work.head, qt.block,
                                                   qt.block_qpos0, p.kv_len);
        const int n_tiles = walker.num_tiles(p.mask.block_kv);
        if (lane == 0) s.item = FwdItem{rank, n_tiles};
        produce<Traits>(params, s, work.batch, work.head, work.head / (p.heads_q / p.heads_kv), qt, walker, n_tiles,
                        ranged, g);
        g += n_tiles;
        rank = next;
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    int g = 0;
    for (int j = 0;; ++j) {
      Barrier::wait(&s.q_full, j & 1);
      const FwdItem item = s.item;
      if (item.rank < 0) break;
      const CtaWork work = scheduler.get_block_coord(item.rank);
      const QTile qt = make_q_tile(work.tile, Traits::kBlockM, p);
      consume<Traits, kSoftcap>(p, s, work.batch, work.head, qt.row0, qt.qpos0, item.n_tiles, g);
      g += item.n_tiles;
    }
  }
#elif defined(__CUDA_ARCH__)
  // Compiled for a target without wgmma (sm_80, or plain sm_90 instead of sm_90a): omni_fwd only launches this
  // kernel on compute capability 9.0, so a library built for sm_90 without the "a" got here. Fail loudly
  // rather than return an unwritten output.
  __trap();
#endif
}

}  // namespace omni::sm90
