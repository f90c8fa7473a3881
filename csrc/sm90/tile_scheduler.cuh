// The sm_90a forward's tile scheduler: which work items (query tile, head, batch) a CTA takes and in what order,
// and the grid and workspace a launch gives it. Persistent CTAs (one per SM) take items from a work counter; the
// others take one item each, by their place in the launch.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "omni_attention.h"

namespace omni::sm90 {

// What a CTA computes: head, query tile, batch row.
struct CtaWork {
  int head, tile, batch;
};

// The grid of a launch of one CTA per work item: (heads, tiles, batch), as launch_rank reads it.
template <int kBlockM>
dim3 fwd_grid(const OmniFwdParams& p) {
  return dim3(p.heads_q, (p.q_len + kBlockM - 1) / kBlockM, p.batch);
}

inline int64_t cta_count(const dim3& grid) { return int64_t(grid.x) * grid.y * grid.z; }

// Bytes of workspace a persistent forward needs: its work counter (zeroed by the launch).
constexpr size_t kPersistentWorkspaceBytes = 16;

// Work items are named by their rank r in (heads x tiles x batch), in sections: each section is `section`
// consecutive (batch, head) pairs, chosen by fwd_l2_section so that their keys and values stay in L2 together while
// its CTAs run; within a section later query tiles come first (under causal masks they see more keys), the tile
// slowest so every head's long tiles lead. Without a persistent grid the r-th CTA in launch order takes rank r,
// except that with two CTAs per SM all resident at once the CTAs from `fold` (the SM count; 0: never) on run the
// ranks backwards, so the SM that took the k-th longest tile gets the k-th shortest beside it rather than the next
// long one. A persistent grid (one CTA per SM) takes ranks from the work counter in the order CTAs ask for them.
// FlashAttention-3's four calls; the producer warp asks, and publishes each rank to the consumers with its Q.
template <int kBlockM, bool kPersistent>
class FwdTileScheduler {
 public:
  __device__ FwdTileScheduler(const OmniFwdParams& p, int fold, int section)
      : p_(p),
        tiles_((p.q_len + kBlockM - 1) / kBlockM),
        total_(int64_t(p.heads_q) * tiles_ * p.batch),
        fold_(fold),
        section_(section) {}

  // The CTA's first rank.
  __forceinline__ __device__ int64_t get_initial_work() const { return kPersistent ? blockIdx.x : launch_rank(); }

  // Whether `rank` names a work item (the ranks past the work end the CTA).
  __forceinline__ __device__ bool is_valid(int64_t rank) const { return rank < total_; }

  // The rank after `rank`; called by a whole warp (lane 0 asks the work counter, which the launch zeroed), before
  // the current item's loads are issued so that the answer is back by the time they are.
  __forceinline__ __device__ int64_t get_next_work(int64_t rank, int lane) const {
    int64_t next = total_;
    if constexpr (kPersistent) {
      if (lane == 0 && rank < total_) {
        next = int64_t(atomicAdd(static_cast<unsigned long long*>(p_.workspace), 1ull)) + gridDim.x;
      }
      next = __shfl_sync(0xffffffff, next, 0);
    }
    return next;
  }

  // The work item of a valid rank.
  __forceinline__ __device__ CtaWork get_block_coord(int64_t rank) const {
    const int64_t first = rank / (int64_t(section_) * tiles_) * section_;  // the section's first (batch, head) pair
    const int64_t left = int64_t(p_.heads_q) * p_.batch - first;
    const int64_t width = left < section_ ? left : section_;  // the last section may be short
    const int64_t within = rank - first * tiles_;
    const int64_t pair = first + within % width;  // batch * heads_q + head
    return {int(pair % p_.heads_q), int(tiles_ - 1 - within / width), int(pair / p_.heads_q)};
  }

 private:
  __forceinline__ __device__ int64_t launch_rank() const {
    const int64_t c = blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
    const int64_t total = int64_t(gridDim.x) * gridDim.y * gridDim.z;
    return fold_ > 0 && c >= fold_ ? total - 1 - (c - fold_) : c;
  }

  const OmniFwdParams& p_;  // the kernel's parameters, read where used (copies would take registers)
  int tiles_;
  int64_t total_;
  int fold_;
  int section_;
};

// (batch, head) pairs per section of FwdTileScheduler: as many KV heads as fit in `l2_bytes` together (their keys
// and values, kv_len rows of `row_bytes` each), times the query heads that share a KV head; every pair when the
// call's CTAs are all resident at once (`resident`: true), so the order is the plain longest-first one.
// FlashAttention-3 budgets 32 MB of the H100's 50 MB L2 in the same way. Without sections, 132 persistent CTAs
// working on 132 different heads of a wide call (a vision tower's 39 images x 16 heads) read every key from DRAM.
// `row_bytes` counts the kernel's head dim: a narrower row (SigLIP's 72 columns, 144 bytes) still fills more of L2
// than its bytes, in whole 32-byte sectors that rows of odd multiples of 16 bytes straddle.
inline int fwd_l2_section(const OmniFwdParams& p, int row_bytes, bool resident, int64_t l2_bytes = 32 << 20) {
  const int64_t pairs = int64_t(p.heads_q) * p.batch;
  const int64_t kv_head_bytes = 2 * int64_t(p.kv_len) * row_bytes;
  const int64_t kv_heads = kv_head_bytes > 0 ? l2_bytes / kv_head_bytes : pairs;
  const int64_t section = (kv_heads > 1 ? kv_heads : 1) * (p.heads_q / p.heads_kv);
  return int(resident || section > pairs ? pairs : section);
}

}  // namespace omni::sm90
