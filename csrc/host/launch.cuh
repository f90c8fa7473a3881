// Host helpers shared by the launchers of every kernel.
#pragma once
#include <cuda_runtime.h>

namespace omni {

// Lets `kernel` use `bytes` of dynamic shared memory on the current device: checks the device's opt-in limit and
// sets the attribute, once per (kernel, device) (cudaFuncSetAttribute costs microseconds on every launch
// otherwise). Returns OMNI_OK or a status whose detail names `name`.
int allow_dynamic_smem(const void* kernel, int bytes, const char* name);

// Multiprocessors of the current device (looked up once per device; 1 if the lookup fails).
int multiprocessors();

}  // namespace omni
