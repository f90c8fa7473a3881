// The sm_90a backward main kernel as seen by run_bwd: whether it can run a call, and its instantiations.
#pragma once
#include <cutlass/numeric_types.h>

#include "common/bwd_workspace.cuh"
#include "omni_attention.h"

namespace omni::sm90 {

// True when the current device is an sm_90 (Hopper), OMNI_HF_DISABLE_SM90 is not set to a non-zero value (read
// at every call) and the call fits the kernel: 128-key mask blocks, and q, k, v, dout readable by TMA. Otherwise
// run_bwd launches sm_80's main kernel. The preprocess is the same for both.
bool bwd_supported(const OmniBwdParams& p);

// Launches the main kernel and the conversion of its dQ accumulator (whose layout is its own, bwd_dq.cuh) for
// validated params on p.fwd.stream, after the preprocess filled the workspace; defined by bwd_launch.cuh,
// instantiated in inst/bwd_sm90_*.cu.
template <typename Element, int kHeadDim>
int run_bwd_main(const OmniBwdParams& p, const bwd::Workspace& ws);

}  // namespace omni::sm90
