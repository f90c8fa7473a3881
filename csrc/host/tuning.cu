// When omni_fwd takes the sm_90a forward (and the workspace it needs) and omni_bwd the sm_90a backward main
// kernel (host code only).
#include <cuda_runtime.h>

#include <cstdlib>

#include "sm90/bwd_api.cuh"
#include "host/launch.cuh"
#include "sm90/fwd_api.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/tma.cuh"

namespace omni::sm90 {
namespace {

constexpr int kMaxDevices = 64;

// Compute capability major * 10 + minor of each device, looked up once (0: not yet known).
bool device_is_sm90() {
  static int capability[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  if (capability[device] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    capability[device] = major * 10 + minor;
  }
  return capability[device] == 90;
}

bool disabled_by_env() {
  const char* v = std::getenv("OMNI_HF_DISABLE_SM90");
  return v != nullptr && v[0] != '\0' && !(v[0] == '0' && v[1] == '\0');
}

// Hopper, not switched off, and q, k, v readable by TMA (which needs q_len and kv_len > 0).
bool hopper_can_read(const OmniFwdParams& p) {
  return !disabled_by_env() && device_is_sm90() && tma_compatible(p.q, p.batch, p.heads_q, p.q_len) &&
         tma_compatible(p.k, p.batch, p.heads_kv, p.kv_len) && tma_compatible(p.v, p.batch, p.heads_kv, p.kv_len);
}

}  // namespace

bool fwd_supported(const OmniFwdParams& p) {
  return (p.mask.block_q == 64 || p.mask.block_q == 128) && p.mask.block_kv == 128 && hopper_can_read(p);
}

size_t fwd_workspace_bytes(const OmniFwdParams& p) {
  if (!fwd_supported(p)) return 0;
  const int sms = multiprocessors();
  const bool rows64 = p.head_dim == 64 ? takes_64_rows<64>(p, sms) : p.head_dim != 128 || takes_64_rows<128>(p, sms);
  return rows64 ? 0 : kPersistentWorkspaceBytes;
}

bool bwd_supported(const OmniBwdParams& p) {
  return p.fwd.mask.block_kv == 128 && hopper_can_read(p.fwd) &&
         tma_compatible(p.dout, p.fwd.batch, p.fwd.heads_q, p.fwd.q_len);
}

}  // namespace omni::sm90
