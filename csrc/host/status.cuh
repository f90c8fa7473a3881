// Status plumbing shared by every entry point: the thread-local failure detail behind
// omni_last_error_detail() and the helpers that set it.
#pragma once
#include <cuda_runtime.h>

#include "omni_attention.h"

namespace omni {

// Clears the detail of the last failure; every entry point calls it first.
void clear_error();

// Records a printf-style detail for omni_last_error_detail() and returns `status`.
int fail(int status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

// OMNI_OK for cudaSuccess; otherwise OMNI_ERR_ARCH (no kernel image) or OMNI_ERR_CUDA with the CUDA
// error text and `what` as the detail.
int check_cuda(cudaError_t err, const char* what);

}  // namespace omni
