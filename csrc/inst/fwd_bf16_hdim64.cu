// Forward instantiation: bf16, head dim 64.
#include "../fwd_launch.cuh"

template int omni::run_fwd<cutlass::bfloat16_t, 64>(const OmniFwdParams&);
