// run_bwd: the three launches of one backward instantiation (preprocess, main kernel, dQ conversion). The main
// kernel and its dQ conversion are the sm_90a ones where sm90::bwd_supported says they can run the call, else
// sm_80's.
// Included only by inst/bwd_<dtype>_hdim<D>.cu, which instantiate it.
#pragma once
#include "sm80/bwd_kernel.cuh"
#include "common/bwd_rows.cuh"
#include "common/bwd_workspace.cuh"
#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "sm90/bwd_api.cuh"
#include "host/status.cuh"

namespace omni::bwd {

// The main kernel, after checking that the device grants its shared memory.
template <class Kt, bool kSoftcap>
int launch_main(const OmniBwdParams& p, const Workspace& ws, dim3 grid, cudaStream_t stream) {
  auto kernel = bwd_main_kernel<Kt, kSoftcap>;
  if (int s = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Kt::kSmemBytes, "bwd_main_kernel")) return s;
  kernel<<<grid, Kt::kNThreads, Kt::kSmemBytes, stream>>>(p, ws);
  return check_cuda(cudaGetLastError(), "bwd_main_kernel launch");
}

template <typename Element, int kHeadDim, int kBlockN>
int run_bwd(const OmniBwdParams& p, const Workspace& ws) {
  using Kt = Traits<Element, kHeadDim, kBlockN>;
  const OmniFwdParams& f = p.fwd;
  auto stream = static_cast<cudaStream_t>(f.stream);
  const dim3 row_grid(f.batch * f.heads_q, static_cast<unsigned>(ws.q_pad / kRowTile));
  const dim3 main_grid(f.batch * f.heads_kv, (f.kv_len + kBlockN - 1) / kBlockN);

  if (row_grid.x > 0 && row_grid.y > 0) {
    bwd_preprocess_kernel<Element, kHeadDim><<<row_grid, kRowThreads, 0, stream>>>(p, ws);
    if (int s = check_cuda(cudaGetLastError(), "backward preprocess launch")) return s;
  }
  if (main_grid.x > 0 && main_grid.y > 0) {
    if (kBlockN == 128 && sm90::bwd_supported(p)) return sm90::run_bwd_main<Element, kHeadDim>(p, ws);
    const int s = dispatch_bool(f.softcap > 0.f, [&](auto softcap) {
      return launch_main<Kt, softcap()>(p, ws, main_grid, stream);
    });
    if (s != OMNI_OK) return s;
  }
  if (row_grid.x > 0 && row_grid.y > 0) {
    bwd_convert_dq_kernel<Element, kHeadDim><<<row_grid, kRowThreads, 0, stream>>>(p, ws);
    if (int s = check_cuda(cudaGetLastError(), "backward dQ conversion launch")) return s;
  }
  return OMNI_OK;
}

}  // namespace omni::bwd
