// sm_90a forward instantiation: bf16, head dim 64.
#include "sm90/fwd_launch.cuh"

template int omni::sm90::run_fwd<cutlass::bfloat16_t, 64>(const OmniFwdParams&);
