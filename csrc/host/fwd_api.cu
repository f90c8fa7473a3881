// omni_fwd and omni_fwd_workspace_bytes: validate the params and dispatch as host/tuning.cuh says: the decode path
// (decode/decode.cuh) for few query rows under an implicit mask, else the instantiation of their dtype and head dim
// of the sm_90a forward or of the sm_80 one (sm90/inst/, sm80/inst/).
#include <cutlass/numeric_types.h>

#include "decode/decode.cuh"
#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/params_check.cuh"
#include "host/status.cuh"
#include "host/tuning.cuh"
#include "sm80/fwd_api.cuh"
#include "sm90/fwd_api.cuh"

namespace omni {
namespace {

template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p) {
  if constexpr (sm90_fwd_head_dim(kHeadDim)) {
    if (tuning::fwd_takes_sm90(p)) return sm90::run_fwd<Element, kHeadDim>(p);
  }
  return sm80::run_fwd<Element, kHeadDim>(p);
}

// The head dim was checked by check_call_params.
template <typename Element>
int run_fwd_head_dim(const OmniFwdParams& p) {
  return dispatch_head_dim(
      p.head_dim, [&](auto head_dim) { return run_fwd<Element, head_dim()>(p); },
      [&] { return fail(OMNI_ERR_HEAD_DIM, "head_dim=%d", p.head_dim); });
}

// The sm_90a forward's workspace: its work counter where it runs persistent 128- or 192-row CTAs (up to head dim
// 128), else none.
size_t sm90_workspace_bytes(const OmniFwdParams& p) {
  const int sms = multiprocessors();
  return dispatch_head_dim(
      p.head_dim,
      [&](auto head_dim) {
        if constexpr (sm90_fwd_head_dim(head_dim())) {
          constexpr bool persistent = sm90::FwdTraits<cutlass::half_t, head_dim(), 128>::kPersistent;
          return !persistent || tuning::sm90_fwd_block_m<head_dim()>(p, sms) == 64 ? size_t{0}
                                                                                   : sm90::kPersistentWorkspaceBytes;
        }
        return size_t{0};
      },
      [] { return size_t{0}; });
}

}  // namespace
}  // namespace omni

extern "C" size_t omni_fwd_workspace_bytes(const OmniFwdParams* params) {
  using namespace omni;
  if (params == nullptr || check_call_params(*params) != OMNI_OK) return 0;
  const OmniFwdParams& p = *params;
  if (tuning::fwd_takes_decode(p)) return decode::workspace_bytes(p);
  return tuning::fwd_takes_sm90(p) ? sm90_workspace_bytes(p) : 0;
}

extern "C" int omni_fwd(const OmniFwdParams* params) {
  using namespace omni;
  clear_error();
  if (params == nullptr) return fail(OMNI_ERR_SHAPE, "params is NULL");
  const OmniFwdParams& p = *params;
  if (int s = check_call_params(p)) return s;
  if (p.mask.kind == OMNI_MASK_BLOCKS) {
    if (int s = check_list(p.mask.kv, (p.q_len + p.mask.block_q - 1) / p.mask.block_q, "kv")) return s;
  }
  if (int s = check_device()) return s;
  if (p.batch == 0 || p.q_len == 0) return OMNI_OK;
  if (tuning::fwd_takes_decode(p)) return decode::run(p);
  return p.dtype == OMNI_BF16 ? run_fwd_head_dim<cutlass::bfloat16_t>(p) : run_fwd_head_dim<cutlass::half_t>(p);
}
