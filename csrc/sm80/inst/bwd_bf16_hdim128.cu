// Backward instantiations: bf16, head dim 128, block_kv 64 and 128.
#include "sm80/bwd_launch.cuh"

template int omni::bwd::run_bwd<cutlass::bfloat16_t, 128, 64>(const OmniBwdParams&, const omni::bwd::Workspace&);
template int omni::bwd::run_bwd<cutlass::bfloat16_t, 128, 128>(const OmniBwdParams&, const omni::bwd::Workspace&);
