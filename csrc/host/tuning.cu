// The host side of host/tuning.cuh: which kernels take a call (host code only).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "decode/decode.cuh"
#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/tuning.cuh"
#include "sm90/tma.cuh"

namespace omni::tuning {
namespace {

bool disabled_by_env() {
  const char* v = std::getenv("OMNI_HF_DISABLE_SM90");
  return v != nullptr && v[0] != '\0' && !(v[0] == '0' && v[1] == '\0');
}

// Hopper, not switched off, and q, k, v readable by TMA (which needs q_len and kv_len > 0).
bool hopper_can_read(const OmniFwdParams& p) {
  return !disabled_by_env() && compute_capability() == OMNI_SM90_CAPABILITY &&
         sm90::tma_compatible(p.q, p.batch, p.heads_q, p.q_len) &&
         sm90::tma_compatible(p.k, p.batch, p.heads_kv, p.kv_len) &&
         sm90::tma_compatible(p.v, p.batch, p.heads_kv, p.kv_len);
}

}  // namespace

bool fwd_takes_decode(const OmniFwdParams& p) {
  return p.mask.kind != OMNI_MASK_BLOCKS && p.bias.ptr == nullptr && decode_head_dim(kernel_head_dim(p.head_dim)) &&
         p.batch >= 1 && p.q_len >= 1 && static_cast<int64_t>(p.q_len) * (p.heads_q / p.heads_kv) <= decode::kMaxRows;
}

bool fwd_takes_sm90(const OmniFwdParams& p) {
  return sm90_fwd_head_dim(kernel_head_dim(p.head_dim)) && (p.mask.block_q == 64 || p.mask.block_q == 128) &&
         p.mask.block_kv == 128 && hopper_can_read(p);
}

bool bwd_takes_sm90(const OmniBwdParams& p) {
  return sm90_bwd_head_dim(kernel_head_dim(p.fwd.head_dim)) && p.fwd.mask.block_kv == 128 && hopper_can_read(p.fwd) &&
         sm90::tma_compatible(p.dout, p.fwd.batch, p.fwd.heads_q, p.fwd.q_len);
}

}  // namespace omni::tuning
