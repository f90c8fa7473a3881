// Host launcher of the sm_80 forward for one (dtype, head dim): picks the tile configuration from the mask's
// block sizes and launches. Included only by the instantiation files in inst/.
#pragma once
#include <cuda_runtime.h>

#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/status.cuh"
#include "sm80/fwd_api.cuh"
#include "sm80/fwd_kernel.cuh"

namespace omni::sm80 {

// 128 x 64 tiles with 4 warps: each warp owns 32 query rows, so every K fragment read from smem feeds two
// MMAs (the smem bandwidth mma.sync needs); wider key tiles push D=64 and D=128 past 255 registers. Above head
// dim 128 a warp owns 16 rows (8 warps for 128-row blocks): 32 rows of a 256-wide output accumulator would take
// 256 registers per thread; above 256, a CTA computes 256 of the output's columns (FwdTraits::kVSplits).
constexpr int kFwdBlockN = 64;
template <int kHeadDim, int kBlockM>
constexpr int kFwdWarps = kHeadDim <= 128 ? 4 : kBlockM / 16;

template <class Traits, bool kSoftcap>
int launch_fwd_kernel(const OmniFwdParams& p) {
  auto kernel = fwd_kernel<Traits, kSoftcap>;
  constexpr int kSmem = Traits::kSmemBytes;
  static_assert(kSmem == sm80_fwd_smem_bytes(Traits::kHeadDim, Traits::kBlockM),
                "the sm_80 forward's shared memory differs from SM80_SMEM_BYTES in csrc/generate_instantiations.py");
  if (kSmem > 48 * 1024) {
    if (int s = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem, "fwd_kernel")) return s;
  }
  const dim3 grid(p.heads_q * Traits::kVSplits, (p.q_len + Traits::kBlockM - 1) / Traits::kBlockM, p.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, static_cast<cudaStream_t>(p.stream)>>>(p);
  return check_cuda(cudaGetLastError(), "fwd_kernel launch");
}

template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p) {
  return dispatch_block(p.mask.block_q, [&](auto block_m) {
    return dispatch_bool(p.softcap > 0.f, [&](auto softcap) {
      return launch_fwd_kernel<FwdTraits<Element, kHeadDim, block_m(), kFwdBlockN, kFwdWarps<kHeadDim, block_m()>>,
                               softcap()>(p);
    });
  });
}

}  // namespace omni::sm80
