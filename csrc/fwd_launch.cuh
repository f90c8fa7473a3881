// Host launcher of the sm_80 forward for one (dtype, head dim): picks the tile configuration from the mask's
// block sizes and launches. Included only by the instantiation files in inst/.
#pragma once
#include <cuda_runtime.h>

#include "dispatch.cuh"
#include "fwd_api.cuh"
#include "fwd_kernel.cuh"
#include "status.cuh"

namespace omni {

// Key-tile width per head dim: 64 keeps D=128 under 255 registers; D=64 affords 128.
template <int kHeadDim>
constexpr int kFwdPreferredBlockN = kHeadDim <= 64 ? 128 : 64;
constexpr int kFwdWarps = 4;

template <class Traits, bool kSoftcap>
int launch_fwd_kernel(const OmniFwdParams& p) {
  auto kernel = fwd_kernel<Traits, kSoftcap>;
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > 48 * 1024) {
    if (int s = check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
                           "cudaFuncSetAttribute(fwd_kernel)"))
      return s;
  }
  const dim3 grid(p.heads_q, (p.q_len + Traits::kBlockM - 1) / Traits::kBlockM, p.batch);
  kernel<<<grid, Traits::kNThreads, kSmem, static_cast<cudaStream_t>(p.stream)>>>(p);
  return check_cuda(cudaGetLastError(), "fwd_kernel launch");
}

template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p) {
  return dispatch_block(p.mask.block_q, [&](auto block_m) {
    return dispatch_block(p.mask.block_kv, [&](auto block_kv) {
      return dispatch_bool(p.softcap > 0.f, [&](auto softcap) {
        constexpr int kBlockN = block_kv() < kFwdPreferredBlockN<kHeadDim> ? block_kv() : kFwdPreferredBlockN<kHeadDim>;
        using Traits = FwdTraits<Element, kHeadDim, block_m(), kBlockN, kFwdWarps>;
        return launch_fwd_kernel<Traits, softcap()>(p);
      });
    });
  });
}

}  // namespace omni
