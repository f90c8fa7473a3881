// The library's tuning policy in one place: which kernels take a call in each direction (the decode path, the
// sm_90a kernels, else the sm_80 ones), the sm_90a forward's CTA height, and the decode path's split of the keys.
// host/fwd_api.cu and host/bwd_api.cu dispatch by it; the launchers read the sizes it picks.
#pragma once
#include <cutlass/numeric_types.h>

#include <cstdint>

#include "omni_attention.h"
#include "sm90/fwd_traits.cuh"
#include "sm90/tile_scheduler.cuh"

namespace omni::tuning {

// The forward's decode path (decode/decode.cuh) takes every call it can: an implicit mask, a head dim it is
// instantiated for (up to 128: at 256 its per-thread K row and V pairs would not fit in registers), and at most
// decode::kMaxRows query rows per KV head (q_len * heads_q / heads_kv).
bool fwd_takes_decode(const OmniFwdParams& p);

// The sm_90a kernels take a call of a head dim they are instantiated for on an sm_90 device (Hopper) unless
// OMNI_HF_DISABLE_SM90 is set to a non-zero value (read at every call, so tests and benchmarks can compare both
// paths in one process), where it fits them:
//   forward: mask blocks of 64 or 128 query rows and 128 keys, keys present, q / k / v readable by TMA;
//   backward: 128-key mask blocks, q / k / v / dout readable by TMA.
// Every other call runs the sm_80 kernels.
bool fwd_takes_sm90(const OmniFwdParams& p);
bool bwd_takes_sm90(const OmniBwdParams& p);

// Whether the sm_90a forward runs 64-row CTAs: where the mask's blocks have 64 rows, or where every 64-row CTA of
// the call is resident at once (e.g. B 1, H 8, S 1024 at head dim 64: 128 CTAs of 64 rows instead of 64 of 128,
// which would leave half of 132 multiprocessors idle). Otherwise 128-row CTAs, whose two warpgroups ping-pong, run
// persistent up to head dim 128 (FwdTraits::kPersistent). `sms`: the device's multiprocessors.
template <int kHeadDim>
bool sm90_fwd_takes_64_rows(const OmniFwdParams& p, int sms) {
  using Traits64 = sm90::FwdTraits<cutlass::half_t, kHeadDim, 64>;  // bf16 has the same sizes
  return p.mask.block_q == 64 || sm90::cta_count(sm90::fwd_grid<64>(p)) <= int64_t(sms) * Traits64::kCtasPerSm;
}

}  // namespace omni::tuning
