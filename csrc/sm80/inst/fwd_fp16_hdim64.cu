// Forward instantiation: fp16, head dim 64.
#include "sm80/fwd_launch.cuh"

template int omni::run_fwd<cutlass::half_t, 64>(const OmniFwdParams&);
