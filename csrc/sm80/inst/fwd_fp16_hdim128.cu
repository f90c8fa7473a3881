// Forward instantiation: fp16, head dim 128.
#include "sm80/fwd_launch.cuh"

template int omni::run_fwd<cutlass::half_t, 128>(const OmniFwdParams&);
