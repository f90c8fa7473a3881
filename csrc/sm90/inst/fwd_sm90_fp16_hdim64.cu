// sm_90a forward instantiation: fp16, head dim 64.
#include "sm90/fwd_launch.cuh"

template int omni::sm90::run_fwd<cutlass::half_t, 64>(const OmniFwdParams&);
