// sm_90a forward instantiation: bf16, head dim 128.
#include "sm90/fwd_launch.cuh"

template int omni::sm90::run_fwd<cutlass::bfloat16_t, 128>(const OmniFwdParams&);
