// The forward instantiations (one per dtype x head dim, each in its own file under inst/) as seen by omni_fwd.
#pragma once
#include <cutlass/numeric_types.h>

#include "omni_attention.h"

namespace omni {

// Launches the forward for validated params; defined by fwd_launch.cuh, instantiated in inst/fwd_*.cu.
template <typename Element, int kHeadDim>
int run_fwd(const OmniFwdParams& p);

}  // namespace omni
