// Weak stand-ins for the backward entry points, so the library links (and omni_bwd reports a clear error)
// in a build without csrc/bwd_api.cu. The backward's strong definitions replace these at link time.
#include "omni_attention.h"
#include "status.cuh"

extern "C" {

__attribute__((weak)) size_t omni_bwd_workspace_bytes(const OmniBwdParams*) { return 0; }

__attribute__((weak)) int omni_bwd(const OmniBwdParams*) {
  omni::clear_error();
  return omni::fail(OMNI_ERR_ARCH, "omni_bwd: this library was built without the backward kernels");
}

}  // extern "C"
