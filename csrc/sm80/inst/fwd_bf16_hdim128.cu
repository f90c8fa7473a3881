// Forward instantiation: bf16, head dim 128.
#include "sm80/fwd_launch.cuh"

template int omni::run_fwd<cutlass::bfloat16_t, 128>(const OmniFwdParams&);
