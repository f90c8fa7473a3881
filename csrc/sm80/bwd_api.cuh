// The sm_80 backward as seen by omni_bwd: its instantiations (one per dtype x head dim, each in its own file under
// inst/), which take every call the sm_90a backward does not (host/tuning.cuh).
#pragma once
#include <cutlass/numeric_types.h>

#include "common/bwd_workspace.cuh"
#include "omni_attention.h"

namespace omni::sm80 {

// Runs preprocess, main kernel and dQ conversion for validated params on p.fwd.stream; returns an OmniStatus.
// Defined by bwd_launch.cuh, instantiated in inst/bwd_<dtype>_hdim<D>.cu.
template <typename Element, int kHeadDim>
int run_bwd(const OmniBwdParams& p, const bwd::Workspace& ws);

}  // namespace omni::sm80
