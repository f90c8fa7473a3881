// sm_90a backward main kernel instantiation: bf16, head dim 128.
#include "sm90/bwd_launch.cuh"

template int omni::sm90::run_bwd_main<cutlass::bfloat16_t, 128>(const OmniBwdParams&, const omni::bwd::Workspace&);
