// The sm_90a forward as seen by omni_fwd: whether it can run a call, and its instantiations.
#pragma once
#include <cutlass/numeric_types.h>

#include <cstddef>

#include "omni_attention.h"

namespace omni::sm90 {

// True when the current device is an sm_90 (Hopper), OMNI_HF_DISABLE_SM90 is not set to a non-zero value
// (read at every call, so tests and benchmarks can compare both paths in one process) and the call fits the
// kernel: mask blocks of 64 or 128 query rows and 128 keys, keys present, q / k / v readable by TMA.
// Otherwise omni_fwd runs sm_80's.
bool fwd_supported(const OmniFwdParams& p);

// Workspace bytes the sm_90a forward needs for the call (0 when fwd_supported is false or it runs 64-row CTAs).
size_t fwd_workspace_bytes(const OmniFwdParams& p);

// Launches the forward for validated params; defined by fwd_launch.cuh, instantiated in inst/fwd_sm90_*.cu.
template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p);

}  // namespace omni::sm90
