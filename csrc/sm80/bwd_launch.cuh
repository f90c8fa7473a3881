// sm80::run_bwd: the three launches of one sm_80 backward (preprocess, main kernel, dQ conversion) for one
// (dtype, head dim). Included only by sm80/inst/bwd_*.cu, which instantiate it.
#pragma once
#include "common/bwd_rows.cuh"
#include "common/bwd_workspace.cuh"
#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/status.cuh"
#include "sm80/bwd_api.cuh"
#include "sm80/bwd_kernel.cuh"

namespace omni::sm80 {

// The main kernel, after checking that the device grants its shared memory.
template <class Kt, bool kSoftcap, bool kDeterministic>
int launch_main(const OmniBwdParams& p, const bwd::Workspace& ws, dim3 grid, cudaStream_t stream) {
  auto kernel = bwd::bwd_main_kernel<Kt, kSoftcap, kDeterministic>;
  if (int s = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), Kt::kSmemBytes, "bwd_main_kernel")) return s;
  kernel<<<grid, Kt::kNThreads, Kt::kSmemBytes, stream>>>(p, ws);
  return check_cuda(cudaGetLastError(), "bwd_main_kernel launch");
}

template <typename Element, int kHeadDim, int kBlockN>
int run_bwd_tiles(const OmniBwdParams& p, const bwd::Workspace& ws) {
  using Kt = bwd::Traits<Element, kHeadDim, kBlockN>;
  const OmniFwdParams& f = p.fwd;
  auto stream = static_cast<cudaStream_t>(f.stream);
  const dim3 row_grid = bwd::row_grid(f, ws);
  const dim3 main_grid(f.batch * f.heads_kv, (f.kv_len + kBlockN - 1) / kBlockN);

  if (int s = bwd::launch_preprocess<Element, kHeadDim>(p, ws)) return s;
  if (main_grid.x > 0 && main_grid.y > 0) {
    const int s = dispatch_bool(f.softcap > 0.f, [&](auto softcap) {
      return dispatch_bool(p.deterministic != 0, [&](auto deterministic) {
        return launch_main<Kt, softcap(), deterministic()>(p, ws, main_grid, stream);
      });
    });
    if (s != OMNI_OK) return s;
  }
  if (row_grid.x > 0 && row_grid.y > 0) {
    bwd::bwd_convert_dq_kernel<Element, kHeadDim><<<row_grid, bwd::kRowThreads, 0, stream>>>(p, ws);
    if (int s = check_cuda(cudaGetLastError(), "backward dQ conversion launch")) return s;
  }
  return OMNI_OK;
}

// Key tiles of the mask's block_kv; above head dim 128, tiles of 64 keys (halves of 128-key blocks), since dK and
// dV of 128 keys x 256 columns would take 256 accumulator registers per thread; above 256, tiles of 32 keys, the
// most that fit in shared memory beside a 64-row tile of Q and of dO (bwd_traits.cuh).
template <typename Element, int kHeadDim>
int run_bwd(const OmniBwdParams& p, const bwd::Workspace& ws) {
  constexpr int kTileOf64Keys = kHeadDim > 256 ? 32 : 64;  // the key tile that runs 64-key blocks
  constexpr int kTileOf128Keys = kHeadDim > 256 ? 32 : kHeadDim > 128 ? 64 : 128;  // and 128-key blocks
  static_assert(bwd::Traits<Element, kHeadDim, kTileOf64Keys>::kSmemBytes == sm80_bwd_smem_bytes(kHeadDim, 64) &&
                    bwd::Traits<Element, kHeadDim, kTileOf128Keys>::kSmemBytes == sm80_bwd_smem_bytes(kHeadDim, 128),
                "the sm_80 backward's shared memory differs from SM80_SMEM_BYTES in csrc/generate_instantiations.py");
  if constexpr (kTileOf64Keys == kTileOf128Keys) {
    return run_bwd_tiles<Element, kHeadDim, kTileOf64Keys>(p, ws);
  } else {
    return dispatch_block(p.fwd.mask.block_kv,
                          [&](auto block_kv) { return run_bwd_tiles<Element, kHeadDim, block_kv()>(p, ws); });
  }
}

}  // namespace omni::sm80
