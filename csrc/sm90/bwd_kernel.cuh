// The sm_90a backward main kernel. One CTA per (128-key block, KV head, batch) walks the active 64-row query
// tiles of its column, for every query head of its GQA group (bwd_walk.cuh, the sm_80 kernel's walk), so dK
// and dV come out summed over the group:
//   warpgroup 0 (producer, one warp): K, V and the keys' token ids once (or, where the token rule's rows are
//     ranges, tile_aux.cuh, the keys' ranges of queries); per tile, TMA loads of Q and dO and bulk copies of lse2
//     and D into a kStages-deep ring completing on mbarriers, the rows' token ids and the tile's bias by cp.async
//     (no ids with ranges; the bias where it can be staged, bias_stageable), and the tile's descriptor beside them.
//   warpgroups 1, 2 (consumers, 64 keys each), per tile, in the transposed orientation so that P^T and dS^T
//     are wgmma A operands straight from registers:
//       S^T = K Q^T, dP^T = V dO^T            (issued together)
//       P^T = exp2(t * mul - lse2) masked by the tile kind (FULL tiles run no mask code)
//       dV += P^T dO                          (in flight while dS is computed)
//       dS^T = P^T (dP^T - D), dK += dS^T Q
//       dQ = dS K                             (dS^T of both warpgroups through smem; each takes a head-dim half,
//                                              or at head dim 96 its own keys, kDqSplitKeys)
//     and the tile's dQ goes through smem into the fp32 workspace, in the threads' order (bwd_dq.cuh), by bulk
//     reductions (cp.reduce.async.bulk .add.f32) that drain while the next tile computes (in the deterministic
//     backward, in the tile's turn and complete before the turn passes: bwd_turns.cuh). With kDqSplitKeys,
//     warpgroup 1 leaves its partial dQ in smem and goes on to the next tile while warpgroup 0 adds it to its
//     own and reduces the sum.
// Above head dim 128 (Traits::kWideHead) a CTA takes 64 keys, half a mask block: the consumers split the tile's
// query rows for S^T / dP^T and the head dim for dK / dV, so P^T and dS^T both go through smem before dV and
// dK, which run beside dQ; the tile's dQ is staged in the tile's own Q / dO stage, which goes back to the
// producer once the reductions have read it.
// Rows past q_len need no mask: lse2 is +inf there, so P = 0. Keys past kv_len are masked like the sm_80
// kernel's (TMA reads them as zeros, but P of a zero score can still overflow when lse is very negative).
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "common/bias.cuh"
#include "common/bwd_workspace.cuh"
#include "common/bwd_scores.cuh"
#include "common/bwd_turns.cuh"
#include "common/bwd_walk.cuh"
#include "common/fragment.cuh"
#include "omni_attention.h"
#include "sm90/bwd_dq.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/sync.cuh"
#include "sm90/tma.cuh"
#include "sm90/tile_mask_token.cuh"
#include "sm90/wgmma.cuh"
#include "common/softmax.cuh"
#include "common/tile_aux.cuh"
#include "common/tile_copy.cuh"
#include "common/tile_mask.cuh"

namespace omni::sm90 {

using namespace cute;
using bwd::QTile;

// The kernel's parameters: the ABI's params, the workspace and the TMA descriptors of q, dout, k, v.
template <class Traits>
struct BwdParams {
  using Element = typename Traits::Element;
  using TmaRows =
      decltype(make_tma_load<Element>(OmniTensor{}, 1, 1, 1, 1, take<0, 2>(typename Traits::SmemLayoutQ{})));
  using TmaKV = decltype(make_tma_load<Element>(OmniTensor{}, 1, 1, 1, 1, typename Traits::SmemLayoutK{}));
  OmniBwdParams p;
  bwd::Workspace ws;
  TmaRows tma_q, tma_dout;
  TmaKV tma_k, tma_v;
};

// Named barriers of the consumer warpgroups (0 is __syncthreads).
constexpr int kDsReadyBarrier = 1;   // both halves of dS^T are in smem; the previous dQ left smem
constexpr int kDqReadyBarrier = 2;   // the tile's dQ is in smem; both dQ GEMMs are done with dS
constexpr int kEpilogueBarrier = 3;  // every GEMM is done with K and V, whose smem takes dK and dV
constexpr int kStageDoneBarrier = 4;  // kWideHead: every GEMM of the tile is done with its Q / dO stage
constexpr int kDqPartialBarrier = 5;  // kDqSplitKeys: warpgroup 1's partial dQ is in smem, both dQ GEMMs are done

// 1-D bulk copy of `bytes` (a multiple of 16) from global to shared memory, completing on `bar`.
__forceinline__ __device__ void bulk_load(void* smem, const void* gmem, int bytes, uint64_t* bar) {
  SM90_BULK_COPY_G2S::copy(gmem, bar, smem, bytes);
}

// Waits until every committed bulk operation of this thread is complete, its writes to global memory included
// (tma_store_wait waits only until the sources are read).
__forceinline__ __device__ void bulk_wait_complete() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// gmem[0 .. bytes) += smem[0 .. bytes) in fp32, asynchronously (committed by tma_store_arrive).
__forceinline__ __device__ void bulk_reduce_add(float* gmem, const float* smem, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))), "r"(bytes)
               : "memory");
}

// The deterministic backward's turns (bwd_turns.cuh), taken by the reducing thread: a tile's dQ reduction starts in
// its turn, and the turn passes once the reduction is complete, which is checked at the next tile's reduction (or
// after the last), so that the wait for completion stays off the tile's critical path. `passing`: the Q tile whose
// turn is still to pass (an index into turns), -1 for none. The kernel's kDeterministic variant alone calls them.
static __noinline__ __device__ void pass_pending_turn(int* turns, int64_t& passing) {
  if (passing < 0) return;
  bulk_wait_complete();
  bwd::pass_turn(turns + passing);
  passing = -1;
}

// Waits for Q tile `tile`'s turn `turn`, once the pending one has passed; the tile's reduction, issued next, is then
// the pending one.
static __noinline__ __device__ void take_dq_turn(int* turns, int64_t tile, int turn, int64_t& passing) {
  pass_pending_turn(turns, passing);
  bwd::wait_turn(turns + tile, turn);
  passing = tile;
}

// The producer warp: K, V once, then every tile of the walk in order, a stage at a time as the consumers free
// them. After the last tile it publishes an invalid tile, which ends the consumers' loop.
template <class Traits, bool kDeterministic, class Params, class Storage>
__forceinline__ __device__ void produce(const Params& params, Storage& s, int b, int h_kv, int kv_block) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  const OmniFwdParams& f = params.p.fwd;
  const OmniMask& m = f.mask;
  const bwd::Workspace& ws = params.ws;
  const int lane = threadIdx.x % 32;
  const int* doc = batch_ids(m.doc_ids, m.ids_stride_b, b);
  const int* grp = batch_ids(m.group_ids, m.ids_stride_b, b);
  const int group = f.heads_q / f.heads_kv;

  Tensor sK = make_tensor(make_smem_ptr(s.k), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(s.v), typename Traits::SmemLayoutK{});
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(s.dout), typename Traits::SmemLayoutQ{});
  auto kv_shape = make_shape(f.kv_len, f.head_dim, f.heads_kv, f.batch);
  auto rows_shape = make_shape(f.q_len, f.head_dim, f.heads_q, f.batch);
  Tensor gK = local_tile(params.tma_k.get_tma_tensor(kv_shape)(_, _, h_kv, b), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                         make_coord(kv_block, _0{}));
  Tensor gV = local_tile(params.tma_v.get_tma_tensor(kv_shape)(_, _, h_kv, b), Shape<Int<kBlockN>, Int<kHeadDim>>{},
                         make_coord(kv_block, _0{}));
  Tensor mQ = params.tma_q.get_tma_tensor(rows_shape);
  Tensor mdO = params.tma_dout.get_tma_tensor(rows_shape);
  if (lane == 0) {
    auto [tKg, tKs] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    auto [tVg, tVs] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    Barrier::arrive_and_expect_tx(&s.kv_full, 2 * Traits::kKVBytes);
    copy(params.tma_k.with(s.kv_full), tKg, tKs);
    copy(params.tma_v.with(s.kv_full), tVg, tVs);
  }
  if (token_ranges_apply(m, b)) {
    stage_token_ranges<kBlockN, 32, true>(s.k_ids, m, b, kv_block * kBlockN, f.kv_len, lane);
  } else {
    stage_token_ids<kBlockN, 32>(s.k_ids, doc, grp, kv_block * kBlockN, f.kv_len, lane);
  }
  arrive_after_staging(&s.kv_full);

  const int mask_block = kv_block * kBlockN / Traits::kMaskBlockN;
  const bwd::ColumnWalk<kBlockM> walk(m, b, h_kv * group, group, mask_block, f.q_len, f.kv_len);
  bwd::WalkCursor cursor = walk.start();
  auto next_tile = [&] {
    QTile tile = walk.next(cursor);
    if (tile.kind == kTileToken && token_ranges_apply(m, b)) tile.kind = kTileTokenRanges;
    if (kDeterministic && tile.valid) {
      tile.turn =
          bwd::dq_turn<kBlockM, kBlockN>(m, b, tile.h, tile.m_block, kv_block * kBlockN, f.q_len, f.kv_len, lane);
    }
    return tile;
  };
  for (int t = 0;; ++t) {
    const int stage = t % Traits::kStages;
    // The deterministic variant counts the tile's turn (global reads) while the consumers still hold the stage.
    QTile tile;
    if constexpr (kDeterministic) tile = next_tile();
    Barrier::wait(&s.empty[stage], ((t / Traits::kStages) & 1) ^ 1);  // a fresh barrier counts as freed once
    if constexpr (!kDeterministic) tile = next_tile();
    if (lane == 0) {
      s.tile[stage] = tile;
      if (tile.valid) {
        const int64_t ws_row = (int64_t(b) * f.heads_q + tile.h) * ws.q_pad + tile.m_block * kBlockM;
        auto tile_of = [&](auto& m_rows) {
          return local_tile(m_rows(_, _, tile.h, b), Shape<Int<kBlockM>, Int<kHeadDim>>{},
                            make_coord(tile.m_block, _0{}));
        };
        auto [tQg, tQs] = tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ(_, _, stage)),
                                        group_modes<0, 2>(tile_of(mQ)));
        auto [tdOg, tdOs] = tma_partition(params.tma_dout, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO(_, _, stage)),
                                          group_modes<0, 2>(tile_of(mdO)));
        Barrier::arrive_and_expect_tx(&s.full[stage], 2 * Traits::kRowTileBytes + 2 * Traits::kRowScalarBytes);
        copy(params.tma_q.with(s.full[stage]), tQg, tQs);
        copy(params.tma_dout.with(s.full[stage]), tdOg, tdOs);
        bulk_load(s.lse2[stage], ws.lse2 + ws_row, Traits::kRowScalarBytes, &s.full[stage]);
        bulk_load(s.dsum[stage], ws.dsum + ws_row, Traits::kRowScalarBytes, &s.full[stage]);
      } else {
        Barrier::arrive(&s.full[stage]);
      }
    }
    if (tile.valid && tile.kind == kTileToken) {
      const int qpos0 = tile.m_block * kBlockM + f.kv_len - f.q_len;
      stage_token_ids<kBlockM, 32>(s.q_ids[stage], doc, grp, qpos0, f.kv_len, lane);
    }
    if constexpr (Traits::kStagedBias) {
      if (tile.valid && bias_stageable(f.bias)) {
        stage_bias_tile<kBlockM, kBlockN, Traits::kBiasPitch, 32>(
            s.bias[stage], f.bias, b, tile.h, tile.m_block * kBlockM, kv_block * kBlockN, f.q_len, f.kv_len, lane);
      }
    }
    arrive_after_staging(&s.full[stage]);
    if (!tile.valid) break;
  }
}

// A coordinate tensor of shape (kRows, kCols) whose element (i, j) is the coordinate (j, i): the S^T-shaped
// fragments' (query row, key) pairs, in the (row, col) order the mask functions of tile_mask.cuh read.
template <int kRows, int kCols>
__forceinline__ __device__ auto transposed_identity() {
  return make_tensor(make_inttuple_iter(make_coord(_0{}, _0{})),
                     make_layout(Shape<Int<kRows>, Int<kCols>>{}, make_stride(E<1>{}, E<0>{})));
}

// Masks the S^T fragment by tile kind (FULL tiles never get here). c: each element's (key, query row) in the
// tile, as the fragment is laid out; c_t: the same pairs as (query row, key), the order of tile_mask.cuh. k_ids:
// the keys' ranges of queries for kTileTokenRanges (the producer staged them), else their ids. col0: the CTA's
// first key; jj0: the same inside its mask block (64 with kWideHead's second half, else 0).
template <class Traits, class TS, class TC, class TCt>
__forceinline__ __device__ void mask_scores_t(TS& acc_s, const TC& c, const TCt& c_t, const QTile& tile,
                                              const OmniMask& m, int kv_len, int qpos0, int col0, int jj0,
                                              const int* q_ids, const int* k_ids) {
  switch (tile.kind) {
    case kTileColLimit:
      mask_col_limit(acc_s, c_t, kv_len - col0);
      break;
    case kTileCausal:
      mask_causal(acc_s, c_t, qpos0, col0);
      break;
    case kTileToken: {
      auto s_rc = rowcol(acc_s);
      mask_token_rule<Traits::kBlockN, Traits::kBlockM, true>(s_rc, rowcol(c), k_ids, q_ids, col0, qpos0, m);
      break;
    }
    case kTileTokenRanges: {
      auto s_rc = rowcol(acc_s);
      mask_token_ranges(s_rc, rowcol(c), k_ids, qpos0);
      break;
    }
    case kTilePool:  // read in place (L1): pool tiles are rare next to the token rule's
      mask_pool(acc_s, c_t, pool_rows_view<Traits::kBlockM>(m, tile.pool, tile.ii0, jj0), kv_len - col0);
      break;
    default:
      break;
  }
}

// The A operands of dV and dK: P^T and dS^T straight from the S^T-shaped registers, or with kWideHead from
// their smem (each warpgroup then needs every row of the tile, of which it computed half).
template <class Traits, class ThrDKV, class TP, class Storage>
__forceinline__ __device__ auto dkv_operands_a(const ThrDKV& thr_dkv, TP& rP, TP& rdS, Storage& s) {
  if constexpr (Traits::kWideHead) {
    return make_tuple(
        thr_dkv.partition_fragment_A(make_tensor(make_smem_ptr(s.pt_or_dq.pt), typename Traits::SmemLayoutdSt{})),
        thr_dkv.partition_fragment_A(make_tensor(make_smem_ptr(s.ds), typename Traits::SmemLayoutdSt{})));
  } else {
    return make_tuple(make_tensor(rP.data(), acc_as_a_operand_layout(rP.layout())),
                      make_tensor(rdS.data(), acc_as_a_operand_layout(rdS.layout())));
  }
}

// The consumer warpgroups: the tiles of the walk (see the file comment), then dK and dV out.
template <class Traits, bool kSoftcap, bool kDeterministic, class Storage>
__forceinline__ __device__ void consume(const OmniBwdParams& p, const bwd::Workspace& ws, Storage& s, int b, int h_kv,
                                        int kv_block) {
  using Element = typename Traits::Element;
  constexpr bool kWideHead = Traits::kWideHead;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kThreads = Traits::kConsumerThreads;
  constexpr int kDqHalfBytes = Traits::kDqHalfFloats * sizeof(float);
  const OmniFwdParams& f = p.fwd;
  const int ctid = threadIdx.x - 128;  // 0 .. kConsumerThreads - 1
  const int n0 = kv_block * kBlockN;
  const int jj0 = n0 % Traits::kMaskBlockN;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDKV mma_dkv;
  typename Traits::TiledMmaDQ mma_dq;
  // The shared-memory operands are partitioned per warpgroup (warpgroup_slice), the accumulators per thread.
  const int wg = cutlass::canonical_warp_group_idx() - 1;  // consumer warpgroup, warp-uniform
  auto thr_sdp = mma_sdp.get_thread_slice(ctid);
  auto wg_sdp = warpgroup_slice(mma_sdp, wg);
  auto wg_dkv = warpgroup_slice(mma_dkv, wg);
  // With kDqSplitKeys each warpgroup runs the dQ GEMM of its keys (dq_keys) as a tiled MMA of its own.
  const int dq_keys = Traits::kDqSplitKeys ? wg : 0;
  auto wg_dq = warpgroup_slice(mma_dq, Traits::kDqSplitKeys ? 0 : wg);
  Tensor sQ = make_tensor(make_smem_ptr(s.q), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(s.dout), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(s.q), typename Traits::SmemLayoutQt{});
  Tensor sdOt = make_tensor(make_smem_ptr(s.dout), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(s.k), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(s.v), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(s.k), typename Traits::SmemLayoutKt{});
  Tensor sdS = make_tensor(make_smem_ptr(s.ds), typename Traits::SmemLayoutdS{});
  Tensor sdSt = make_tensor(make_smem_ptr(s.ds), typename Traits::SmemLayoutdSt{});

  // Operands: S^T / dP^T read K / V and the stage's Q / dO; dV / dK read P^T / dS^T (dkv_operands_a) and the
  // stage's dO^T / Q^T; dQ reads all of dS and this warpgroup's half of K^T, or with kDqSplitKeys the columns
  // of its own keys of both.
  Tensor tSrK = wg_sdp.partition_fragment_A(sK);
  Tensor tSrV = wg_sdp.partition_fragment_A(sV);
  Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);
  Tensor tSrdO = wg_sdp.partition_fragment_B(sdO);
  Tensor tKVrQt = wg_dkv.partition_fragment_B(sQt);
  Tensor tKVrdOt = wg_dkv.partition_fragment_B(sdOt);
  Tensor tQrdS = wg_dq.partition_fragment_A(
      local_tile(sdS, Shape<Int<kBlockM>, Int<Traits::kDqKeys>>{}, make_coord(_0{}, dq_keys)));
  Tensor tQrKt = wg_dq.partition_fragment_B(
      local_tile(sKt, Shape<Int<kHeadDim>, Int<Traits::kDqKeys>>{}, make_coord(_0{}, dq_keys)));

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(acc_dk);
  clear(acc_dv);
  Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
  Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<kBlockM>>{});
  Tensor rP = make_tensor<Element>(acc_s.layout());
  Tensor rdS = make_tensor<Element>(acc_s.layout());
  auto [tKVaP, tKVadS] = dkv_operands_a<Traits>(wg_dkv, rP, rdS, s);

  // Each score's (key, query row) in the tile, and the same as (query row, key).
  const Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kBlockM>>{}));
  const Tensor cS_t = thr_sdp.partition_C(transposed_identity<kBlockN, kBlockM>());
  auto s_rc = rowcol(acc_s);
  auto dp_rc = rowcol(acc_dp);
  auto cS_rc = rowcol(cS);

  const float mul = softmax_scale_log2(f, kSoftcap);
  const bool reduces = ctid == 0;  // the thread that issues the dQ reductions

  if (kDeterministic && reduces) s.dq_passing = -1;
  Barrier::wait(&s.kv_full, 0);
  for (int t = 0;; ++t) {
    const int stage = warp_uniform(t % kStages);  // at head dim 256 ptxas kept t per thread (wgmma.cuh)
    Barrier::wait(&s.full[stage], (t / kStages) & 1);
    const QTile tile = s.tile[stage];
    if (!tile.valid) break;
    gemm_issue<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage), acc_s);
    gemm_issue<true>(mma_sdp, tSrV, tSrdO(_, _, _, stage), acc_dp);
    if constexpr (kWideHead) {  // the previous tile's reductions have read its dQ: its stage is free
      if (reduces && t > 0) {
        tma_store_wait<0>();
        Barrier::arrive(&s.empty[(t - 1) % kStages]);
      }
    }
    const int qpos0 = tile.m_block * kBlockM + f.kv_len - f.q_len;

    // P^T = exp2(t * mul - lse2), the query rows being the fragment's columns.
    gemm_wait<1>(acc_s);
    if constexpr (kSoftcap) {  // the accurate tanhf, as the sm_80 kernel, so that P matches an exact lse
      CUTE_UNROLL
      for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * (f.scale / f.softcap));
    }
    if (f.bias.ptr != nullptr) {  // from the tile the producer staged, else in place
      const int row0 = tile.m_block * kBlockM;
      const ScoreView bias = Traits::kStagedBias && bias_stageable(f.bias)
                                 ? ScoreView{s.bias[stage], Traits::kBiasPitch * 2, 2, f.bias.dtype}
                                 : score_view(f.bias, f.bias.ptr, f.bias.dtype, b, tile.h).from(row0, n0);
      add_bias_tile<true>(acc_s, cS, bias, false, f.q_len - row0, f.kv_len - n0, 1.f / f.scale);
    }
    if (tile.kind != kTileFull) {
      mask_scores_t<Traits>(acc_s, cS, cS_t, tile, f.mask, f.kv_len, qpos0, n0, jj0, s.q_ids[stage], s.k_ids);
    }
    CUTE_UNROLL
    for (int c = 0; c < size<1>(s_rc); ++c) {
      const float lse2 = s.lse2[stage][get<1>(cS_rc(0, c))];
      CUTE_UNROLL
      for (int r = 0; r < size<0>(s_rc); ++r) s_rc(r, c) = fast_exp2(s_rc(r, c) * mul - lse2);
    }
    rP = convert_fragment<Element>(acc_s);
    if constexpr (kWideHead) {
      store_accumulator(mma_sdp, ctid, rP, make_tensor(make_smem_ptr(s.pt_or_dq.pt), typename Traits::SmemLayoutdSt{}));
    } else {
      gemm_issue<false>(mma_dkv, tKVaP, tKVrdOt(_, _, _, stage), acc_dv);
    }

    // dS^T = P^T (dP^T - D) while dV runs.
    gemm_wait<kWideHead ? 0 : 1>(acc_dp);
    CUTE_UNROLL
    for (int c = 0; c < size<1>(dp_rc); ++c) {
      const int row = get<1>(cS_rc(0, c));
      const float dsum = s.dsum[stage][row];
      const float lse2 = s.lse2[stage][row];
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dp_rc); ++r) {
        dp_rc(r, c) = bwd::score_grad<kSoftcap>(s_rc(r, c), dp_rc(r, c), dsum, lse2, 1.f / mul);
      }
    }
    if (p.dbias.ptr != nullptr) {
      write_bias_grad<true>(acc_dp, cS, p.dbias, b, tile.h, tile.m_block * kBlockM, n0, f.q_len, f.kv_len);
    }
    rdS = convert_fragment<Element>(acc_dp);
    if constexpr (!kWideHead) gemm_issue<false>(mma_dkv, tKVadS, tKVrQt(_, _, _, stage), acc_dk);

    // dS^T (and P^T) to smem (the previous tile's GEMMs are done with them: kDqReadyBarrier), visible to wgmma.
    store_accumulator(mma_sdp, ctid, rdS, sdSt);
    cutlass::arch::fence_view_async_shared();
    if constexpr (!kWideHead) {
      if (reduces) tma_store_wait<0>();  // the previous tile's reductions have read the dQ block
    }
    named_barrier_sync(kDsReadyBarrier, kThreads);
    if constexpr (kWideHead) {
      gemm_issue<false>(mma_dkv, tKVaP, tKVrdOt(_, _, _, stage), acc_dv);
      gemm_issue<false>(mma_dkv, tKVadS, tKVrQt(_, _, _, stage), acc_dk);
    }

    // dQ = dS K for this warpgroup's head-dim half (or keys), then into the workspace.
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
    gemm_issue<true>(mma_dq, tQrdS, tQrKt, acc_dq);
    gemm_wait<0>(acc_dq);
    warpgroup_fence_operand(rP);
    warpgroup_fence_operand(rdS);
    float* dq_lo;
    float* dq_hi;
    // The deterministic backward's turn at the tile, kept while the stage is still this tile's.
    if (kDeterministic && reduces) s.dq_turn = s.tile[stage].turn;
    if constexpr (kWideHead) {
      // Every GEMM of the tile is done with the stage, whose Q and dO tiles take the dQ halves.
      named_barrier_sync(kStageDoneBarrier, kThreads);
      dq_lo = reinterpret_cast<float*>(&sQ(0, 0, stage));
      dq_hi = reinterpret_cast<float*>(&sdO(0, 0, stage));
    } else {
      Barrier::arrive(&s.empty[stage]);
      dq_lo = s.pt_or_dq.dq;
      dq_hi = dq_lo + Traits::kDqHalfFloats;
    }
    if constexpr (Traits::kDqSplitKeys) {
      // Warpgroup 1's partial sum into the block (the previous tile's reductions are done with it: DsReady), then
      // warpgroup 0 adds its own. Warpgroup 1 waits for the sum too rather than running ahead: as fast (kernel_ab,
      // case set d96), and racecheck cannot follow a dQ-ready barrier of warpgroup 0 alone.
      if (dq_keys == 1) store_dq_slots<Traits>(acc_dq, dq_lo, dq_hi, ctid % 128);
      named_barrier_sync(kDqPartialBarrier, kThreads);
      if (dq_keys == 0) store_dq_slots<Traits, true>(acc_dq, dq_lo, dq_hi, ctid);
    } else {
      store_dq_slots<Traits>(acc_dq, dq_lo, dq_hi, ctid);
    }
    tma_store_fence();
    named_barrier_sync(kDqReadyBarrier, kThreads);
    if (reduces) {
      const int64_t tile_row = (int64_t(b) * f.heads_q + tile.h) * ws.q_pad + tile.m_block * kBlockM;
      float* dq_rows = ws.dq_accum + tile_row * kHeadDim;
      if constexpr (kDeterministic) take_dq_turn(ws.dq_turns, tile_row / kBlockM, s.dq_turn, s.dq_passing);
      bulk_reduce_add(dq_rows, dq_lo, kDqHalfBytes);
      bulk_reduce_add(dq_rows + Traits::kDqHalfFloats, dq_hi, kDqHalfBytes);
      tma_store_arrive();
    } else if constexpr (kWideHead) {
      Barrier::arrive(&s.empty[stage]);  // the reducing thread arrives once its reductions have read the stage
    }
  }
  if (reduces) {
    if constexpr (kDeterministic) pass_pending_turn(ws.dq_turns, s.dq_passing);
    tma_store_wait<0>();
  }

  // Epilogue: dK * scale and dV as Element through the smem of K and V (free once both warpgroups are past their
  // last GEMM), then 16-byte stores of this warpgroup's rows below kv_len.
  named_barrier_sync(kEpilogueBarrier, kThreads);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= f.scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  store_accumulator(mma_dkv, ctid, rdK, sK);
  store_accumulator(mma_dkv, ctid, rdV, sV);
  named_barrier_sync(kEpilogueBarrier, kThreads);

  constexpr int kPerRow = row_vector_threads<kHeadDim, 32>();
  using StoreThreads = Layout<Shape<Int<kThreads / kPerRow>, Int<kPerRow>>, Stride<Int<kPerRow>, _1>>;
  auto store_op =
      make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{}, StoreThreads{}, Layout<Shape<_1, _8>>{});
  auto store_thr = store_op.get_thread_slice(ctid);
  const Tensor cKV = store_thr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  auto rows_of = [&](const OmniTensor& t) {
    Element* ptr = static_cast<Element*>(t.ptr) + b * t.stride_b + h_kv * t.stride_h + int64_t(n0) * t.stride_s;
    return make_tensor(make_gmem_ptr(ptr), Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(t.stride_s, _1{}));
  };
  store_rows(store_op, store_thr.partition_S(sK), store_thr.partition_D(rows_of(p.dk)), cKV, f.kv_len - n0, f.head_dim);
  store_rows(store_op, store_thr.partition_S(sV), store_thr.partition_D(rows_of(p.dv)), cKV, f.kv_len - n0, f.head_dim);
}

template <class Traits, bool kSoftcap, bool kDeterministic>
__global__ void __launch_bounds__(Traits::kNThreads, 1) bwd_kernel(const __grid_constant__ BwdParams<Traits> params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Storage = typename Traits::SharedStorage;
  extern __shared__ __align__(1024) char smem[];
  Storage& s = *reinterpret_cast<Storage*>(smem);
  const int h_kv = blockIdx.x;
  const int b = blockIdx.y;
  const int kv_block = blockIdx.z;  // every head's first (most loaded, under causal masks) blocks go first

  if (threadIdx.x == 0) {
    Barrier::init(&s.kv_full, kFullArrivals);
    for (int i = 0; i < Traits::kStages; ++i) {
      Barrier::init(&s.full[i], kFullArrivals);
      Barrier::init(&s.empty[i], Traits::kConsumerThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x < 32) produce<Traits, kDeterministic>(params, s, b, h_kv, kv_block);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
    consume<Traits, kSoftcap, kDeterministic>(params.p, params.ws, s, b, h_kv, kv_block);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built without sm_90a; omni_bwd launches this kernel only on compute capability 9.0
#endif
}

}  // namespace omni::sm90
