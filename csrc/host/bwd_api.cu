// omni_bwd and omni_bwd_workspace_bytes: validate the params, carve the workspace and dispatch as host/tuning.cuh
// says: the instantiation of their dtype and head dim of the sm_90a backward or of the sm_80 one (sm90/inst/,
// sm80/inst/), each launching the preprocess, its main kernel and its dQ conversion.
#include <cutlass/numeric_types.h>

#include <cstdint>

#include "common/bwd_workspace.cuh"
#include "host/dispatch.cuh"
#include "host/params_check.cuh"
#include "host/status.cuh"
#include "host/tuning.cuh"
#include "sm80/bwd_api.cuh"
#include "sm90/bwd_api.cuh"

namespace omni::bwd {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int check_bwd_params(const OmniBwdParams& p) {
  const OmniFwdParams& f = p.fwd;
  if (int s = check_call_params(f)) return s;
  if (int s = check_tensor(p.dout, "dout")) return s;
  if (int s = check_tensor(p.dq, "dq")) return s;
  if (int s = check_tensor(p.dk, "dk")) return s;
  if (int s = check_tensor(p.dv, "dv")) return s;
  if (p.dbias.ptr != nullptr && f.bias.ptr == nullptr)
    return fail(OMNI_ERR_SHAPE, "dbias is given but the call has no bias");
  if (p.dsinks != nullptr && f.sinks == nullptr)
    return fail(OMNI_ERR_SHAPE, "dsinks is given but the call has no sinks");
  if (p.deterministic && (p.dsinks != nullptr || (p.dbias.ptr != nullptr && !p.dbias.exclusive)))
    return fail(OMNI_ERR_SHAPE, "deterministic=%d with %s: those are added with atomics; the caller sums them",
                p.deterministic, p.dsinks != nullptr ? "dsinks" : "a dbias that is not exclusive");
  if (f.mask.kind == OMNI_MASK_BLOCKS) {
    if (int s = check_list(f.mask.q, static_cast<int>(ceil_div(f.kv_len, f.mask.block_kv)), "q")) return s;
    // The deterministic backward counts each dQ tile's earlier key blocks in the row view (common/bwd_turns.cuh).
    if (p.deterministic) {
      if (int s = check_list(f.mask.kv, static_cast<int>(ceil_div(f.q_len, f.mask.block_q)), "kv")) return s;
    }
  }
  if (ceil_div(f.kv_len, f.mask.block_kv) > OMNI_MAX_GRID_YZ || ceil_div(f.q_len, kRowTile) > OMNI_MAX_GRID_YZ)
    return fail(OMNI_ERR_SHAPE, "kv_len=%d or q_len=%d exceeds the backward's grid limit (%lld tiles)", f.kv_len,
                f.q_len, static_cast<long long>(OMNI_MAX_GRID_YZ));
  const size_t need = workspace_bytes(f);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need))
    return fail(OMNI_ERR_WORKSPACE, "workspace of %zu bytes at %p; the backward needs %zu", p.workspace_bytes,
                p.workspace, need);
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return fail(OMNI_ERR_WORKSPACE, "workspace pointer %p is not 16-byte aligned", p.workspace);
  return OMNI_OK;
}

template <typename Element, int kHeadDim>
int run_bwd(const OmniBwdParams& p, const Workspace& ws) {
  if constexpr (sm90_bwd_head_dim(kHeadDim)) {
    if (tuning::bwd_takes_sm90(p)) return sm90::run_bwd<Element, kHeadDim>(p, ws);
  }
  return sm80::run_bwd<Element, kHeadDim>(p, ws);
}

// The head dim was checked by check_call_params.
template <typename Element>
int run_bwd_head_dim(const OmniBwdParams& p, const Workspace& ws) {
  return dispatch_head_dim(
      p.fwd.head_dim, [&](auto head_dim) { return run_bwd<Element, head_dim()>(p, ws); },
      [&] { return fail(OMNI_ERR_HEAD_DIM, "head_dim=%d", p.fwd.head_dim); });
}

}  // namespace
}  // namespace omni::bwd

extern "C" size_t omni_bwd_workspace_bytes(const OmniBwdParams* params) {
  return params == nullptr ? 0 : omni::bwd::workspace_bytes(params->fwd);
}

extern "C" int omni_bwd(const OmniBwdParams* params) {
  using namespace omni;
  clear_error();
  if (params == nullptr) return fail(OMNI_ERR_SHAPE, "params is NULL");
  const OmniBwdParams& p = *params;
  if (int s = bwd::check_bwd_params(p)) return s;
  if (int s = check_device()) return s;
  if (p.fwd.batch == 0) return OMNI_OK;
  const bwd::Workspace ws = bwd::carve_workspace(p.workspace, p.fwd);
  return p.fwd.dtype == OMNI_BF16 ? bwd::run_bwd_head_dim<cutlass::bfloat16_t>(p, ws)
                                  : bwd::run_bwd_head_dim<cutlass::half_t>(p, ws);
}
