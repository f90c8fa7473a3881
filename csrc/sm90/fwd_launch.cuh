// Host launcher of the sm_90a forward for one (dtype, head dim): builds the TMA descriptors and launches.
// Included only by the instantiation files in sm90/inst/.
#pragma once
#include <cuda_runtime.h>

#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/status.cuh"
#include "host/tuning.cuh"
#include "sm90/fwd_api.cuh"
#include "sm90/fwd_kernel.cuh"

namespace omni::sm90 {

// `sms`: the device's multiprocessors.
template <class Traits, bool kSoftcap>
int launch_fwd_kernel(const OmniFwdParams& p, int sms) {
  using Element = typename Traits::Element;
  const dim3 grid = fwd_grid<Traits::kBlockM>(p);
  const int64_t ctas = cta_count(grid);
  const bool pairs = Traits::kCtasPerSm == 2 && ctas > sms && ctas <= 2 * sms;  // see FwdTileScheduler
  // An implicit mask has no block rows (its block_q is only how finely the rows are walked): a CTA walks the
  // keys of its own rows, whatever its height.
  OmniFwdParams walked = p;
  if (p.mask.kind != OMNI_MASK_BLOCKS) walked.mask.block_q = Traits::kBlockM;
  const FwdParams<Traits> params{
      walked,
      make_tma_load<Element>(p.q, p.batch, p.heads_q, p.q_len, p.head_dim, typename Traits::SmemLayoutQ{}),
      make_tma_load<Element>(p.k, p.batch, p.heads_kv, p.kv_len, p.head_dim,
                             take<0, 2>(typename Traits::SmemLayoutK{})),
      make_tma_load<Element>(p.v, p.batch, p.heads_kv, p.kv_len, p.head_dim,
                             take<0, 2>(typename Traits::SmemLayoutV{})),
      pairs ? sms : 0,
      fwd_l2_section(p, Traits::kHeadDim * sizeof(Element), ctas <= int64_t(sms) * Traits::kCtasPerSm)};
  auto kernel = fwd_kernel<Traits, kSoftcap>;
  constexpr int kSmem = Traits::kSmemBytes;
  if (int s = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem, "sm90 fwd_kernel")) return s;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  dim3 launch_grid = grid;
  if constexpr (Traits::kPersistent) {  // one CTA per SM and a zeroed work counter
    if (p.workspace == nullptr || p.workspace_bytes < kPersistentWorkspaceBytes) {
      return fail(OMNI_ERR_WORKSPACE,
                  "workspace of %zu bytes at %p; the persistent sm90 forward needs %zu (ask "
                  "omni_fwd_workspace_bytes)",
                  p.workspace_bytes, p.workspace, kPersistentWorkspaceBytes);
    }
    if (int s = check_cuda(cudaMemsetAsync(p.workspace, 0, kPersistentWorkspaceBytes, stream), "work counter"))
      return s;
    launch_grid = dim3(static_cast<unsigned>(ctas < sms ? ctas : sms));
  }
  kernel<<<launch_grid, Traits::kNThreads, kSmem, stream>>>(params);
  return check_cuda(cudaGetLastError(), "sm90 fwd_kernel launch");
}

// 64-, 128- or 192-row CTAs (persistent from 128 rows up to head dim 128), as host/tuning.cuh's sm90_fwd_block_m
// decides; 192 rows only at head dim 64 without softcap.
template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p) {
  const int sms = multiprocessors();
  const int block_m = tuning::sm90_fwd_block_m<kHeadDim>(p, sms);
  return dispatch_bool(p.softcap > 0.f, [&](auto softcap) {
    if constexpr (kHeadDim == 64 && !softcap()) {
      if (block_m == 192) return launch_fwd_kernel<FwdTraits<Element, kHeadDim, 192>, false>(p, sms);
    }
    return block_m == 64 ? launch_fwd_kernel<FwdTraits<Element, kHeadDim, 64>, softcap()>(p, sms)
                         : launch_fwd_kernel<FwdTraits<Element, kHeadDim, 128>, softcap()>(p, sms);
  });
}

}  // namespace omni::sm90
