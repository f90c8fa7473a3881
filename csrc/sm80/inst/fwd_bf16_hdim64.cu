// Forward instantiation: bf16, head dim 64.
#include "sm80/fwd_launch.cuh"

template int omni::run_fwd<cutlass::bfloat16_t, 64>(const OmniFwdParams&);
