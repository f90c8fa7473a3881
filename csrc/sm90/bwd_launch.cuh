// Host launcher of the sm_90a backward for one (dtype, head dim): the preprocess, then the main kernel with its TMA
// descriptors, one CTA per (KV head, batch, key block), then the dQ conversion of its accumulator layout
// (bwd_dq.cuh). Included only by the instantiation files in sm90/inst/.
#pragma once
#include <cuda_runtime.h>

#include "common/bwd_rows.cuh"
#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/status.cuh"
#include "sm90/bwd_api.cuh"
#include "sm90/bwd_kernel.cuh"

namespace omni::sm90 {

template <class Traits, bool kSoftcap, bool kDeterministic>
int launch_bwd_kernel(const OmniBwdParams& p, const bwd::Workspace& ws) {
  using Element = typename Traits::Element;
  const OmniFwdParams& f = p.fwd;
  const auto rows_box = take<0, 2>(typename Traits::SmemLayoutQ{});
  const BwdParams<Traits> params{
      p,
      ws,
      make_tma_load<Element>(f.q, f.batch, f.heads_q, f.q_len, f.head_dim, rows_box),
      make_tma_load<Element>(p.dout, f.batch, f.heads_q, f.q_len, f.head_dim, rows_box),
      make_tma_load<Element>(f.k, f.batch, f.heads_kv, f.kv_len, f.head_dim, typename Traits::SmemLayoutK{}),
      make_tma_load<Element>(f.v, f.batch, f.heads_kv, f.kv_len, f.head_dim, typename Traits::SmemLayoutK{})};
  auto kernel = bwd_kernel<Traits, kSoftcap, kDeterministic>;
  constexpr int kSmem = Traits::kSmemBytes;
  if (int s = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem, "sm90 bwd_kernel")) return s;
  const dim3 grid(f.heads_kv, f.batch, (f.kv_len + Traits::kBlockN - 1) / Traits::kBlockN);
  kernel<<<grid, Traits::kNThreads, kSmem, static_cast<cudaStream_t>(f.stream)>>>(params);
  if (int s = check_cuda(cudaGetLastError(), "sm90 bwd_kernel launch")) return s;
  const dim3 rows_grid(f.batch * f.heads_q, static_cast<unsigned>(ws.q_pad / Traits::kBlockM));
  bwd_convert_dq_kernel<Traits><<<rows_grid, Traits::kDqThreads, 0, static_cast<cudaStream_t>(f.stream)>>>(p, ws);
  return check_cuda(cudaGetLastError(), "sm90 bwd_convert_dq_kernel launch");
}

template <typename Element, int kHeadDim>
int run_bwd(const OmniBwdParams& p, const bwd::Workspace& ws) {
  if (int s = bwd::launch_preprocess<Element, kHeadDim>(p, ws)) return s;
  // The deterministic backward is a kernel of its own, so that the default one carries none of its code.
  return dispatch_bool(p.fwd.softcap > 0.f, [&](auto softcap) {
    return dispatch_bool(p.deterministic != 0, [&](auto deterministic) {
      return launch_bwd_kernel<BwdTraits<Element, kHeadDim>, softcap(), deterministic()>(p, ws);
    });
  });
}

}  // namespace omni::sm90
