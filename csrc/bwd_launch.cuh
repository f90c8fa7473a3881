// run_bwd: the three launches of one backward instantiation (preprocess, main kernel, dQ conversion). The main
// kernel and its dQ conversion are the sm_90a ones where sm90::bwd_supported says they can run the call, else
// sm_80's.
// Included only by inst/bwd_<dtype>_hdim<D>.cu, which instantiate it.
#pragma once
#include "bwd_kernel.cuh"
#include "bwd_rows.cuh"
#include "bwd_run.cuh"
#include "dispatch.cuh"
#include "sm90/bwd_api.cuh"
#include "status.cuh"

namespace omni::bwd {

// The main kernel, after checking that the device grants its shared memory.
template <class Kt, bool kSoftcap>
int launch_main(const OmniBwdParams& p, const Workspace& ws, dim3 grid, cudaStream_t stream) {
  auto kernel = bwd_main_kernel<Kt, kSoftcap>;
  int device = 0, max_smem = 0;
  if (int s = check_cuda(cudaGetDevice(&device), "cudaGetDevice")) return s;
  if (int s = check_cuda(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                         "cudaDeviceGetAttribute"))
    return s;
  if (max_smem < Kt::kSmemBytes)
    return fail(OMNI_ERR_ARCH, "backward (head_dim=%d, block_kv=%d) needs %d bytes of shared memory per block; "
                "device %d allows %d", Kt::kHeadDim, Kt::kBlockN, Kt::kSmemBytes, device, max_smem);
  if (int s = check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Kt::kSmemBytes),
                         "cudaFuncSetAttribute(bwd_main_kernel)"))
    return s;
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
