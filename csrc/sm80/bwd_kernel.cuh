// The backward main kernel (sm_80, mma.sync): one CTA per (KV head x batch, KV tile of kBlockN keys: a mask
// block, or half of a 128-key one) accumulates dK and dV of its keys in registers over every active Q tile of
// its block's column, for all query heads of its GQA group (so dK / dV come out summed over the group), and adds
// each tile's dQ contribution to the fp32 workspace with atomics (no second pass over the row view: that would
// recompute S and dP). The kDeterministic variant adds them in the tile's turn (common/bwd_turns.cuh), so that every
// element of dq_accum sums the same terms in the same order on every run.
//
// Per Q tile (kBlockM rows of query head h), while Q, dO, lse2 and D of the next tile load:
//   S  = Q K^T                     (t = tanh(scale * S / softcap) with softcap, else t = S)
//   P  = exp2(t * mul - lse2)      masked by the tile kind; mul = log2(e) * (softcap or scale)
//   dP = dO V^T
//   dS = P * (dP - D)              (times 1 - t^2 with softcap)
//   dV += P^T dO,  dQ_accum += dS K,  dK += dS^T Q
// The factor `scale` of dK and dQ is applied once at the end (dK here, dQ in the conversion kernel).
#pragma once
#include <cute/tensor.hpp>

#include "common/bias.cuh"
#include "sm80/bwd_atomic.cuh"
#include "sm80/bwd_mask.cuh"
#include "common/bwd_turns.cuh"
#include "common/bwd_workspace.cuh"
#include "common/bwd_scores.cuh"
#include "sm80/bwd_traits.cuh"
#include "common/bwd_walk.cuh"
#include "common/fragment.cuh"
#include "sm80/mma.cuh"
#include "common/softmax.cuh"
#include "common/tile_aux.cuh"
#include "common/tile_copy.cuh"

namespace omni::bwd {

using namespace cute;

// Rows row0 .. row0 + kRows - 1 of head h, batch b of a [B, H, S, kCols] tensor, as a gmem tile.
template <typename Element, int kRows, int kCols>
__forceinline__ __device__ auto gmem_rows(const OmniTensor& t, int b, int h, int row0) {
  Element* ptr = static_cast<Element*>(t.ptr) + b * t.stride_b + h * t.stride_h + int64_t(row0) * t.stride_s;
  return make_tensor(make_gmem_ptr(ptr), Shape<Int<kRows>, Int<kCols>>{}, make_stride(t.stride_s, _1{}));
}

// 16-byte cp.async of one vector into shared memory.
__forceinline__ __device__ void cp_async_16(void* smem, const void* gmem) {
  SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>::copy(*static_cast<const uint128_t*>(gmem), *static_cast<uint128_t*>(smem));
}

// kSoftcap: s = cap * tanh(scale * S / cap), with the accurate tanhf so that P matches an exact lse.
// kDeterministic: each tile's dQ atomics in its turn (OmniBwdParams::deterministic).
template <typename Kt, bool kSoftcap, bool kDeterministic>
__global__ void __launch_bounds__(Kt::kNThreads, 1)
    bwd_main_kernel(const __grid_constant__ OmniBwdParams p, const Workspace ws) {
  using Element = typename Kt::Element;
  constexpr int kBlockM = Kt::kBlockM;
  constexpr int kBlockN = Kt::kBlockN;
  constexpr int kD = Kt::kHeadDim;
  constexpr int kNThreads = Kt::kNThreads;
  constexpr int kQBuffers = Kt::kQBuffers;
  constexpr int kDQ = Kt::kDQ;
  static_assert(kBlockM == kRowTile, "the workspace pads rows to the backward's tile");

  extern __shared__ __align__(1024) char smem_raw[];
  auto& sm = *reinterpret_cast<typename Kt::SharedStorage*>(smem_raw);

  const OmniFwdParams& f = p.fwd;
  const int tid = threadIdx.x;
  const int b = blockIdx.x / f.heads_kv;
  const int hkv = blockIdx.x % f.heads_kv;
  const int group = f.heads_q / f.heads_kv;
  const int n0 = blockIdx.y * kBlockN;  // every head's first (most loaded, under causal masks) tiles go first
  const int kv_rows = min(kBlockN, f.kv_len - n0);
  // The mask block holding the tile: the tile is that block, or one of its 64-key halves (kBlockN < block_kv).
  const int n_block = n0 / f.mask.block_kv;
  const int jj0 = n0 - n_block * f.mask.block_kv;
  // cp.async of the token ids of kCount positions from pos0 (batch row b) into smem.
  auto stage_ids = [&](auto count, int* smem, int pos0) {
    const OmniMask& m = f.mask;
    stage_token_ids<decltype(count)::value, kNThreads>(smem, batch_ids(m.doc_ids, m.ids_stride_b, b),
                                                       batch_ids(m.group_ids, m.ids_stride_b, b), pos0, f.kv_len, tid);
  };
  // P = exp2(t * mul - lse2) with t = S, or t = tanh(scale * S / cap) under softcap.
  const float mul = softmax_scale_log2(f, kSoftcap);
  auto qpos0_of = [&](const QTile& t) { return t.m_block * kBlockM + f.kv_len - f.q_len; };

  // Shared-memory tensors; Q and dO (and their transposed views) per buffer, of which there are kQBuffers: the loop
  // alternates buf, and a single buffer serves both values.
  auto sQ = [&](int buf) {
    return make_tensor(make_smem_ptr(sm.q[buf % kQBuffers].data()), typename Kt::SmemLayoutQ{});
  };
  auto sdO = [&](int buf) {
    return make_tensor(make_smem_ptr(sm.dout[buf % kQBuffers].data()), typename Kt::SmemLayoutQ{});
  };
  auto sQt = [&](int buf) {
    return make_tensor(make_smem_ptr(sm.q[buf % kQBuffers].data()), typename Kt::SmemLayoutQt{});
  };
  auto sdOt = [&](int buf) {
    return make_tensor(make_smem_ptr(sm.dout[buf % kQBuffers].data()), typename Kt::SmemLayoutQt{});
  };
  auto lse2_of = [&](int buf) { return sm.lse2[buf % kQBuffers].data(); };
  auto dsum_of = [&](int buf) { return sm.dsum[buf % kQBuffers].data(); };
  Tensor sK = make_tensor(make_smem_ptr(sm.k.data()), typename Kt::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(sm.v.data()), typename Kt::SmemLayoutK{});
  // K^T of dQ slice `i`: columns i * kDQ .. of K, a whole number of swizzle atoms in (SmemLayoutTile).
  auto sKt = [&](int i) {
    return make_tensor(make_smem_ptr(sm.k.data() + i * kBlockN * kDQ), typename Kt::SmemLayoutKt{});
  };
  Tensor sP = make_tensor(make_smem_ptr(sm.p.data()), typename Kt::SmemLayoutP{});
  Tensor sdS = make_tensor(make_smem_ptr(sm.ds.data()), typename Kt::SmemLayoutP{});
  Tensor sPt = make_tensor(make_smem_ptr(sm.p.data()), typename Kt::SmemLayoutPt{});
  Tensor sdSt = make_tensor(make_smem_ptr(sm.ds.data()), typename Kt::SmemLayoutPt{});

  // gmem -> smem: 16-byte cp.async, rows past the tensor's end zero-filled.
  typename Kt::GmemTiledLoad load_op;
  auto load_thr = load_op.get_thread_slice(tid);
  Tensor cQ = load_thr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kD>>{}));
  Tensor cK = load_thr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kD>>{}));

  // Issues tile t's loads into buffer buf as one cp.async group: Q and dO, lse2 and D (padded rows).
  auto load_q_tile = [&](const QTile& t, int buf) {
    const int m0 = t.m_block * kBlockM;
    const int rows = f.q_len - m0;
    load_rows<kBlockM, kD>(load_op, load_thr.partition_S(gmem_rows<Element, kBlockM, kD>(f.q, b, t.h, m0)),
                           load_thr.partition_D(sQ(buf)), cQ, rows, f.head_dim);
    load_rows<kBlockM, kD>(load_op, load_thr.partition_S(gmem_rows<Element, kBlockM, kD>(p.dout, b, t.h, m0)),
                           load_thr.partition_D(sdO(buf)), cQ, rows, f.head_dim);
    const int64_t ws_row = (int64_t(b) * f.heads_q + t.h) * ws.q_pad + m0;
    constexpr int kVecs = kBlockM / 4;  // 16-byte vectors of one per-row array
    if (tid < kVecs) {
      cp_async_16(lse2_of(buf) + tid * 4, ws.lse2 + ws_row + tid * 4);
    } else if (tid < 2 * kVecs) {
      cp_async_16(dsum_of(buf) + (tid - kVecs) * 4, ws.dsum + ws_row + (tid - kVecs) * 4);
    }
    cp_async_fence();
  };
  // The token ids of tile t's rows, when the token rule masks it (cp.async, not committed here).
  auto stage_q_ids = [&](const QTile& t) {
    if (t.kind == kTileToken) stage_ids(Int<kBlockM>{}, sm.q_ids, qpos0_of(t));
  };

  // Tensor cores: S / dP, dK / dV and dQ, with the ldmatrix copies that feed them and the C-layout
  // copy that stores P and dS.
  typename Kt::TiledMmaSdP mma_sdp;
  typename Kt::TiledMmaDKV mma_dkv;
  typename Kt::TiledMmaDQ mma_dq;
  auto copy_qdo = make_tiled_copy_A(typename Kt::SmemCopyAtom{}, mma_sdp);             // Q, dO
  auto copy_kv = make_tiled_copy_B(typename Kt::SmemCopyAtom{}, mma_sdp);              // K, V
  auto copy_pt = make_tiled_copy_A(typename Kt::SmemCopyAtomTransposed{}, mma_dkv);    // P^T, dS^T
  auto copy_qdot = make_tiled_copy_B(typename Kt::SmemCopyAtomTransposed{}, mma_dkv);  // dO^T, Q^T
  auto copy_ds = make_tiled_copy_A(typename Kt::SmemCopyAtom{}, mma_dq);               // dS
  auto copy_kt = make_tiled_copy_B(typename Kt::SmemCopyAtomTransposed{}, mma_dq);     // K^T
  auto store_pds = make_tiled_copy_C(typename Kt::SmemCopyAtomAcc{}, mma_sdp);         // P, dS -> smem
  auto copy_qdo_thr = copy_qdo.get_thread_slice(tid);
  auto copy_qdot_thr = copy_qdot.get_thread_slice(tid);
  auto store_pds_thr = store_pds.get_thread_slice(tid);
  Tensor tSsK = copy_kv.get_thread_slice(tid).partition_S(sK);
  Tensor tdPsV = copy_kv.get_thread_slice(tid).partition_S(sV);
  Tensor tdVsPt = copy_pt.get_thread_slice(tid).partition_S(sPt);
  Tensor tdKsdSt = copy_pt.get_thread_slice(tid).partition_S(sdSt);
  Tensor tdQsdS = copy_ds.get_thread_slice(tid).partition_S(sdS);
  Tensor tPsP = store_pds_thr.partition_D(sP);
  Tensor tPsdS = store_pds_thr.partition_D(sdS);

  // Register operand fragments, shared by the GEMMs of the same shape.
  Tensor rA_sdp = make_tensor<Element>(partition_shape_A(mma_sdp, Shape<Int<kBlockM>, Int<kD>>{}));      // Q, dO
  Tensor rB_sdp = make_tensor<Element>(partition_shape_B(mma_sdp, Shape<Int<kBlockN>, Int<kD>>{}));      // K, V
  Tensor rA_dkv = make_tensor<Element>(partition_shape_A(mma_dkv, Shape<Int<kBlockN>, Int<kBlockM>>{}));  // P^T, dS^T
  Tensor rB_dkv = make_tensor<Element>(partition_shape_B(mma_dkv, Shape<Int<kD>, Int<kBlockM>>{}));  // dO^T, Q^T
  Tensor rA_dq = make_tensor<Element>(partition_shape_A(mma_dq, Shape<Int<kBlockM>, Int<kBlockN>>{}));  // dS
  Tensor rB_dq = make_tensor<Element>(partition_shape_B(mma_dq, Shape<Int<kDQ>, Int<kBlockN>>{}));  // K^T

  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<kD>>{});
  clear(acc_dk);
  clear(acc_dv);

  // (row, col) inside the tile of each score this thread holds; rows as (row, col) of the accumulator.
  Tensor cS = mma_sdp.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  auto cS_rc = rowcol(cS);

  // Thread 0 walks the column two tiles ahead of the compute: when the iteration of buffer buf starts,
  // tiles[buf ^ 1] is the next tile (its loads are issued then, or with one buffer at the iteration's end); after
  // the barrier thread 0 writes the one after it into tiles[buf], the slot of the current tile, which every thread
  // has read already. The walk's global reads delay warp 0 only, and only when a new list entry starts.
  auto column_walk = [&] { return ColumnWalk<kBlockM>(f.mask, b, hkv * group, group, n_block, f.q_len, f.kv_len); };
  auto advance_walk = [&](QTile& slot) { slot = column_walk().next(sm.cursor); };
  if (tid == 0) {
    sm.cursor = column_walk().start();
    advance_walk(sm.tiles[0]);
    advance_walk(sm.tiles[1]);
  }
  __syncthreads();
  QTile cur = sm.tiles[0];
  if (cur.valid) {
    // K, V and the token ids of the keys and of the first tile's rows join its cp.async group.
    load_rows<kBlockN, kD>(load_op, load_thr.partition_S(gmem_rows<Element, kBlockN, kD>(f.k, b, hkv, n0)),
                           load_thr.partition_D(sK), cK, kv_rows, f.head_dim);
    load_rows<kBlockN, kD>(load_op, load_thr.partition_S(gmem_rows<Element, kBlockN, kD>(f.v, b, hkv, n0)),
                           load_thr.partition_D(sV), cK, kv_rows, f.head_dim);
    stage_ids(Int<kBlockN>{}, sm.k_ids, n0);
    stage_q_ids(cur);
    load_q_tile(cur, 0);

    // The next tile, tiles[buf ^ 1], is read from smem at each use rather than held in registers.
    for (int buf = 0;; buf ^= 1) {
      if (kQBuffers == 2 && sm.tiles[buf ^ 1].valid) {
        load_q_tile(sm.tiles[buf ^ 1], buf ^ 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // tile `cur` visible in buffer buf
      if (tid == 0 && sm.tiles[buf ^ 1].valid) advance_walk(sm.tiles[buf]);
      // The deterministic backward's turn at this tile's dQ, counted by warp 0 while the others start the GEMMs.
      int turn = 0;
      if (kDeterministic && tid < 32) {
        turn = dq_turn<kBlockM, kBlockN>(f.mask, b, cur.h, cur.m_block, n0, f.q_len, f.kv_len, tid);
      }

      // S = Q K^T -> t = S or tanh(scale * S / cap), masked -> P = exp2(t * mul - lse2), stored to smem
      // as Element; the fp32 P replaces t in registers.
      const TileCoords at{qpos0_of(cur), n0, kv_rows, jj0, sm.q_ids, sm.k_ids};
      FragmentBits<decltype(size(bits_view(cS)))::value> bits;
      partial_bits<kBlockM, kBlockN>(bits, bits_view(cS), cur, at, f.mask);
      Tensor acc_s = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      clear(acc_s);
      gemm_ss(acc_s, rA_sdp, rB_sdp, copy_qdo_thr.partition_S(sQ(buf)), tSsK, mma_sdp, copy_qdo, copy_kv);
      if constexpr (kSoftcap) {
        const float tanh_in = f.scale / f.softcap;
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) = tanhf(acc_s(i) * tanh_in);
      }
      if (f.bias.ptr != nullptr) {
        add_bias(acc_s, cS, f.bias, b, cur.h, cur.m_block * kBlockM, n0, f.q_len, f.kv_len, 1.f / f.scale);
      }
      mask_q_tile(acc_s, cS, cur, at, bits);
      auto p_rc = rowcol(acc_s);
      Tensor p_elem = make_tensor<Element>(acc_s.layout());
      auto pe_rc = rowcol(p_elem);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(p_rc); ++r) {
        const float lse2 = lse2_of(buf)[get<0>(cS_rc(r, 0))];
        CUTE_UNROLL
        for (int c = 0; c < size<1>(p_rc); ++c) {
          p_rc(r, c) = fast_exp2(p_rc(r, c) * mul - lse2);
          pe_rc(r, c) = static_cast<Element>(p_rc(r, c));
        }
      }
      copy(store_pds, retile(store_pds, p_elem), tPsP);

      // dP = dO V^T -> dS = P (dP - D) [* (1 - t^2), t = (log2 P + lse2) / mul], stored to smem as Element.
      Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<Int<kBlockM>, Int<kBlockN>>{});
      clear(acc_dp);
      gemm_ss(acc_dp, rA_sdp, rB_sdp, copy_qdo_thr.partition_S(sdO(buf)), tdPsV, mma_sdp, copy_qdo, copy_kv);
      auto dp_rc = rowcol(acc_dp);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(dp_rc); ++r) {
        const int row = get<0>(cS_rc(r, 0));
        const float d = dsum_of(buf)[row];
        const float lse2 = lse2_of(buf)[row];
        CUTE_UNROLL
        for (int c = 0; c < size<1>(dp_rc); ++c) {
          dp_rc(r, c) = score_grad<kSoftcap>(p_rc(r, c), dp_rc(r, c), d, lse2, 1.f / mul);
        }
      }
      if (p.dbias.ptr != nullptr) {
        write_bias_grad(acc_dp, cS, p.dbias, b, cur.h, cur.m_block * kBlockM, n0, f.q_len, f.kv_len);
      }
      Tensor ds_elem = convert_fragment<Element>(acc_dp);
      copy(store_pds, retile(store_pds, ds_elem), tPsdS);
      __syncthreads();  // P and dS visible; the rows' token ids are read

      // dV += P^T dO.
      gemm_ss(acc_dv, rA_dkv, rB_dkv, tdVsPt, copy_qdot_thr.partition_S(sdOt(buf)), mma_dkv, copy_pt, copy_qdot);

      // dQ_accum += dS K, kDQ columns at a time, as atomics that drain while the dK GEMM runs (in the deterministic
      // backward, once the earlier key tiles' are in: the turn is taken before and passed after they complete).
      float* dq_rows = ws.dq_accum + ((int64_t(b) * f.heads_q + cur.h) * ws.q_pad + cur.m_block * kBlockM) * kD;
      int* dq_turns = ws.dq_turns + (int64_t(b) * f.heads_q + cur.h) * (ws.q_pad / kBlockM) + cur.m_block;
      if constexpr (kDeterministic) {
        if (tid == 0) wait_turn(dq_turns, turn);
        __syncthreads();
      }
      CUTE_UNROLL
      for (int i = 0; i < Kt::kDQSplits; ++i) {
        Tensor acc_dq = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kDQ>>{});
        clear(acc_dq);
        gemm_ss(acc_dq, rA_dq, rB_dq, tdQsdS, copy_kt.get_thread_slice(tid).partition_S(sKt(i)), mma_dq, copy_ds,
                copy_kt);
        Tensor gdQ =
            make_tensor(make_gmem_ptr(dq_rows + i * kDQ), Shape<Int<kBlockM>, Int<kDQ>>{}, Stride<Int<kD>, _1>{});
        Tensor tdQgdQ = mma_dq.get_thread_slice(tid).partition_C(gdQ);
        atomic_add_fragment(acc_dq, tdQgdQ);
      }
      if constexpr (kDeterministic) {
        __threadfence();  // this thread's atomics are performed before the turn passes
        __syncthreads();
        if (tid == 0) pass_turn(dq_turns);
      }

      // The next tile's row ids (the current ones were read before the barrier), loading during dK.
      if (sm.tiles[buf ^ 1].valid && sm.tiles[buf ^ 1].kind == kTileToken) {
        stage_q_ids(sm.tiles[buf ^ 1]);
        cp_async_fence();  // completes by the next iteration's cp_async_wait<1>
      }

      // dK += dS^T Q.
      gemm_ss(acc_dk, rA_dkv, rB_dkv, tdKsdSt, copy_qdot_thr.partition_S(sQt(buf)), mma_dkv, copy_pt, copy_qdot);

      __syncthreads();  // buffer buf, P and dS are free for the next tile
      if (!sm.tiles[buf ^ 1].valid) break;
      if constexpr (kQBuffers == 1) load_q_tile(sm.tiles[buf ^ 1], buf ^ 1);
      cur = sm.tiles[buf ^ 1];
    }
  }

  // Epilogue: dK * scale and dV as Element through smem (over K and V, free now), then 16-byte stores of
  // the rows below kv_len. Columns with no active tile store zeros.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= f.scale;
  Tensor sdK = make_tensor(make_smem_ptr(sm.k.data()), typename Kt::SmemLayoutK{});
  Tensor sdV = make_tensor(make_smem_ptr(sm.v.data()), typename Kt::SmemLayoutK{});
  auto store_dkv = make_tiled_copy_C(typename Kt::SmemCopyAtomAcc{}, mma_dkv);
  auto store_dkv_thr = store_dkv.get_thread_slice(tid);
  Tensor dk_elem = convert_fragment<Element>(acc_dk);
  Tensor dv_elem = convert_fragment<Element>(acc_dv);
  copy(store_dkv, retile(store_dkv, dk_elem), store_dkv_thr.partition_D(sdK));
  copy(store_dkv, retile(store_dkv, dv_elem), store_dkv_thr.partition_D(sdV));
  __syncthreads();
  typename Kt::GmemTiledStore store_op;
  auto store_thr = store_op.get_thread_slice(tid);
  Tensor cKs = store_thr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kD>>{}));
  store_rows(store_op, store_thr.partition_S(sdK),
             store_thr.partition_D(gmem_rows<Element, kBlockN, kD>(p.dk, b, hkv, n0)), cKs, kv_rows, f.head_dim);
  store_rows(store_op, store_thr.partition_S(sdV),
             store_thr.partition_D(gmem_rows<Element, kBlockN, kD>(p.dv, b, hkv, n0)), cKs, kv_rows, f.head_dim);
}

}  // namespace omni::bwd
