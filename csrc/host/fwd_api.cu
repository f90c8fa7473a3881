// omni_fwd: validates the params and dispatches: the decode path (decode/decode.cuh) for few query rows under an
// implicit mask, else the instantiation of their dtype and head dim: the sm_90a kernel where sm90::fwd_supported
// says it can run the call (Hopper), else the sm_80 kernel.
#include "sm80/fwd_api.cuh"
#include "decode/decode.cuh"
#include "host/params_check.cuh"
#include "sm90/fwd_api.cuh"
#include "host/status.cuh"

namespace omni {
namespace {

template <typename Element>
int run_fwd_head_dim(const OmniFwdParams& p) {
  const bool hopper = sm90::fwd_supported(p);
  switch (p.head_dim) {
    case 64: return hopper ? sm90::run_fwd<Element, 64>(p) : run_fwd<Element, 64>(p);
    case 128: return hopper ? sm90::run_fwd<Element, 128>(p) : run_fwd<Element, 128>(p);
    default: return fail(OMNI_ERR_HEAD_DIM, "head_dim=%d; the forward is built for 64 and 128", p.head_dim);
  }
}

}  // namespace
}  // namespace omni

extern "C" size_t omni_fwd_workspace_bytes(const OmniFwdParams* params) {
  using namespace omni;
  if (params == nullptr || check_call_params(*params) != OMNI_OK) return 0;
  return decode::supported(*params) ? decode::workspace_bytes(*params) : sm90::fwd_workspace_bytes(*params);
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
  if (decode::supported(p)) return decode::run(p);
  return p.dtype == OMNI_BF16 ? run_fwd_head_dim<cutlass::bfloat16_t>(p) : run_fwd_head_dim<cutlass::half_t>(p);
}
