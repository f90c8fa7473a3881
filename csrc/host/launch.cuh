// Host helpers shared by the launchers of every kernel: per-device facts, each looked up once per device.
#pragma once
#include <cuda_runtime.h>

namespace omni {

// Lets `kernel` use `bytes` of dynamic shared memory on the current device: checks the device's opt-in limit and
// sets the attribute, once per (kernel, device) (cudaFuncSetAttribute costs microseconds on every launch
// otherwise). Returns OMNI_OK or a status whose detail names `name`.
int allow_dynamic_smem(const void* kernel, int bytes, const char* name);

// CTAs of `kernel` (launched with `threads` threads and `smem_bytes` of dynamic shared memory, which
// allow_dynamic_smem must have allowed) that reside on one multiprocessor of the current device, into *count;
// looked up once per (kernel, device). Returns OMNI_OK or a status.
int resident_ctas(const void* kernel, int threads, int smem_bytes, int* count);

// Multiprocessors of the current device (looked up once per device; 1 if the lookup fails).
int multiprocessors();

// Compute capability of the current device as major * 10 + minor (looked up once per device; 0 if the lookup fails).
int compute_capability();

}  // namespace omni
