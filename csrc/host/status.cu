// omni_abi_version, omni_error_string, omni_last_error_detail and the failure detail they report.
#include <cstdarg>
#include <cstdio>

#include "host/status.cuh"

namespace {
thread_local char g_detail[512] = "";
}

namespace omni {

void clear_error() { g_detail[0] = '\0'; }

int fail(int status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(g_detail, sizeof(g_detail), fmt, args);
  va_end(args);
  return status;
}

int check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return OMNI_OK;
  const int status =
      (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) ? OMNI_ERR_ARCH : OMNI_ERR_CUDA;
  return fail(status, "%s: %s (%s)", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

}  // namespace omni

extern "C" {

int omni_abi_version(void) { return OMNI_ABI_VERSION; }

const char* omni_error_string(int status) {
  switch (status) {
    case OMNI_OK:
      return "ok";
    case OMNI_ERR_DTYPE:
      return "unsupported dtype (expected fp16 or bf16)";
    case OMNI_ERR_HEAD_DIM:
      return "head_dim is not a multiple of 8 up to the largest kernel head dim";
    case OMNI_ERR_BLOCK_SIZE:
      return "mask block size not supported by the kernel";
    case OMNI_ERR_ALIGNMENT:
      return "pointer or stride not 16-byte aligned, or last dim not contiguous";
    case OMNI_ERR_SHAPE:
      return "inconsistent sizes";
    case OMNI_ERR_ARCH:
      return "no kernel image for this GPU";
    case OMNI_ERR_CUDA:
      return "CUDA call or launch failed";
    case OMNI_ERR_WORKSPACE:
      return "workspace missing or too small";
    default:
      return "unknown status";
  }
}

const char* omni_last_error_detail(void) { return g_detail; }

}  // extern "C"
