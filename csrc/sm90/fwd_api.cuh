// The sm_90a forward as seen by omni_fwd: its instantiations (one per dtype x head dim, each in its own file under
// inst/), which take the calls host/tuning.cuh's fwd_takes_sm90 gives them.
#pragma once
#include <cutlass/numeric_types.h>

#include "omni_attention.h"

namespace omni::sm90 {

// Launches the forward for validated params; defined by fwd_launch.cuh, instantiated in inst/fwd_<dtype>_hdim<D>.cu.
// p.workspace holds omni_fwd_workspace_bytes (the work counter of persistent CTAs).
template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p);

}  // namespace omni::sm90
