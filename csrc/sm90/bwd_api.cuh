// The sm_90a backward as seen by omni_bwd: its instantiations (one per dtype x head dim, each in its own file under
// inst/), which take the calls host/tuning.cuh's bwd_takes_sm90 gives them.
#pragma once
#include <cutlass/numeric_types.h>

#include "common/bwd_workspace.cuh"
#include "omni_attention.h"

namespace omni::sm90 {

// Runs the preprocess (common/bwd_rows.cuh, as sm_80's backward), the main kernel and the conversion of its dQ
// accumulator (whose layout is its own, bwd_dq.cuh) for validated params on p.fwd.stream; returns an OmniStatus.
// Defined by bwd_launch.cuh, instantiated in inst/bwd_<dtype>_hdim<D>.cu.
template <typename Element, int kHeadDim>
int run_bwd(const OmniBwdParams& p, const bwd::Workspace& ws);

}  // namespace omni::sm90
