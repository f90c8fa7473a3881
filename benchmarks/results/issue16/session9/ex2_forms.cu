#include <cuda_fp16.h>
// 8 independent exps per thread so the SASS shows the per-instruction form
__global__ void f32(const float* x, float* y) {
  int i = threadIdx.x; float acc = 0;
  #pragma unroll
  for (int j = 0; j < 8; ++j) { float r; asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x[i * 8 + j])); acc += r; }
  y[i] = acc;
}
__global__ void f16x2(const unsigned* x, unsigned* y) {
  int i = threadIdx.x; unsigned acc = 0;
  #pragma unroll
  for (int j = 0; j < 8; ++j) { unsigned r; asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(r) : "r"(x[i * 8 + j])); acc ^= r; }
  y[i] = acc;
}
__global__ void bf16x2(const unsigned* x, unsigned* y) {
  int i = threadIdx.x; unsigned acc = 0;
  #pragma unroll
  for (int j = 0; j < 8; ++j) { unsigned r; asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(r) : "r"(x[i * 8 + j])); acc ^= r; }
  y[i] = acc;
}
