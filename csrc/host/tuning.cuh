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

// The forward's decode path (decode/decode.cuh) takes every call it can: an implicit mask, no bias, a head dim it is
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

// Whether 192-row CTAs pay at head dim 64 under an implicit mask (measured against 128-row CTAs on an H100): they
// make at least four waves (1.3 waves ran 0.88x of 128-row CTAs, 2.6-5.3 even, 10-21 waves 1.09x), and their last
// tile pads q_len by at most 1/16 more rows than a 128-row one (CLIP-L's 577 patches: 768 rows against 640 ran 0.97x).
inline bool sm90_fwd_192_rows_pay(const OmniFwdParams& p, int sms) {
  const int64_t padded_192 = int64_t(p.q_len + 191) / 192 * 192;
  const int64_t padded_128 = int64_t(p.q_len + 127) / 128 * 128;
  return sm90::cta_count(sm90::fwd_grid<192>(p)) >= 4 * int64_t(sms) && 16 * padded_192 <= 17 * padded_128;
}

// The sm_90a forward's CTA height:
//   64 where the mask's blocks have 64 rows, or where every 64-row CTA of the call is resident at once (e.g. B 1,
//     H 8, S 1024 at head dim 64: 128 CTAs of 64 rows instead of 64 of 128, which would leave half of 132
//     multiprocessors idle);
//   192 at head dim 64 under an implicit mask (no block rows to keep to), without softcap (its consumers' 160
//     registers spill the capped scores), where they pay (above): three consumer warpgroups take turns at the
//     tensor cores, as in FlashAttention-3's head-dim-64 tiles;
//   else 128, whose two warpgroups ping-pong.
// 128- and 192-row CTAs run persistent up to head dim 128 (FwdTraits::kPersistent). `sms`: the device's
// multiprocessors.
template <int kHeadDim>
int sm90_fwd_block_m(const OmniFwdParams& p, int sms) {
  using Traits64 = sm90::FwdTraits<cutlass::half_t, kHeadDim, 64>;  // bf16 has the same sizes
  if (p.mask.block_q == 64 || sm90::cta_count(sm90::fwd_grid<64>(p)) <= int64_t(sms) * Traits64::kCtasPerSm) return 64;
  const bool implicit = p.mask.kind != OMNI_MASK_BLOCKS;
  return kHeadDim == 64 && implicit && p.softcap <= 0.f && sm90_fwd_192_rows_pay(p, sms) ? 192 : 128;
}

}  // namespace omni::tuning
