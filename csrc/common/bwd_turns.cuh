// The deterministic backward (OmniBwdParams::deterministic): the CTAs that add into one Q tile's dQ take turns, in
// ascending key order, so every element of dq_accum sums the same terms in the same order on every run. A turn
// counter per Q tile (Workspace::dq_turns, zeroed by the preprocess) counts the CTAs done with it; a CTA waits until
// the counter reaches its turn (dq_turn), adds its dQ, makes the sum visible and advances the counter. The CTAs a
// turn waits for have lower key tiles, which the grids launch first (the KV tile is the slowest grid dim), so a
// waiting CTA never holds the SM that an earlier one needs.
#pragma once
#include "common/mask_rule.cuh"

namespace omni::bwd {

// How many key blocks before block kb reach Q block qb under an implicit mask (OMNI_MASK_CAUSAL, OMNI_MASK_FULL):
// those whose column walk lists it (bwd_walk.cuh), which are those holding an allowed pair of its rows. Counts the
// blocks first, first + stride, ... before kb (a lane's share of them), so that the shares of lanes 0 .. stride - 1
// add up to the whole.
__host__ __device__ inline int implicit_blocks_before(const OmniMask& m, int qb, int kb, int q_len, int kv_len,
                                                      int first, int stride) {
  if (m.kind == OMNI_MASK_FULL || m.window <= 0) {
    // Every earlier block reaches it: all of them under FULL; under causal without a window, a block of earlier
    // keys holds an allowed pair wherever a later one does.
    return first == 0 ? kb : 0;
  }
  const int qpos_first = qb * m.block_q + kv_len - q_len;
  const int qpos_last = implicit_last_qpos(m, qpos_first, kv_len);
  int before = 0;
  for (int k = first; k < kb; k += stride) {
    const BlockSpan span = implicit_column_span(m, k, q_len, kv_len);
    before += qb >= span.first && qb < span.first + span.count &&
              implicit_block_type(m, qpos_first, qpos_last, k, kv_len) != OMNI_MASKED;
  }
  return before;
}

// The turn at Q tile m_block (kBlockM rows, query head h, batch b) of the CTA whose key tile of kBlockN keys starts
// at key n0: how many key tiles before it visit that Q tile. A tile visits the Q tiles of the mask blocks of its
// column (bwd_walk.cuh): for a block list, the blocks before its own in the Q block's row view (the row and column
// views list the same blocks); for an implicit kind, implicit_blocks_before. Each of a mask block's
// block_kv / kBlockN key tiles takes a turn. Called by every lane of one warp; returns the same value in each. Not
// inlined: its callers (the sm_90a producer warp, warp 0 of the sm_80 kernel) have few registers to spare, and the
// call keeps what it needs out of the rest of their code.
template <int kBlockM, int kBlockN>
__noinline__ __device__ int dq_turn(const OmniMask& m, int b, int h, int m_block, int n0, int q_len, int kv_len,
                                    int lane) {
  const int qb = m_block * kBlockM / m.block_q;
  const int kb = n0 / m.block_kv;
  int before = 0;
  if (m.kind == OMNI_MASK_BLOCKS) {
    const BlockRow row = block_row(m.kv, b, m.heads == 1 ? 0 : h, qb);
    for (int e = lane; e < row.count; e += 32) before += row.indices[e] < kb;
  } else {
    before = implicit_blocks_before(m, qb, kb, q_len, kv_len, lane, 32);
  }
  before = __reduce_add_sync(0xffffffffu, before);
  return before * (m.block_kv / kBlockN) + (n0 % m.block_kv) / kBlockN;
}

// Spins until the counter at `turns` reads `turn` (acquire: what the earlier CTAs added is visible after).
__forceinline__ __device__ void wait_turn(const int* turns, int turn) {
  int now;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(now) : "l"(turns) : "memory");
  } while (now != turn);
}

// Advances the counter at `turns` once this thread's additions are complete (release: they are visible first).
__forceinline__ __device__ void pass_turn(int* turns) {
  asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.s32 [%0], 1;" ::"l"(turns) : "memory");
}

}  // namespace omni::bwd
