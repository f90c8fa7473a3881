// The sm_80 forward as seen by omni_fwd: its instantiations (one per dtype x head dim, each in its own file under
// inst/), which take every call the decode path and the sm_90a forward do not (host/tuning.cuh).
#pragma once
#include <cutlass/numeric_types.h>

#include "omni_attention.h"

namespace omni::sm80 {

// Launches the forward for validated params; defined by fwd_launch.cuh, instantiated in inst/fwd_<dtype>_hdim<D>.cu.
template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p);

}  // namespace omni::sm80
