// Per-thread values the compiler must re-derive where they are used. Offsets derived from a plain threadIdx.x
// (fragment coordinates, swizzled smem addresses, gmem copy offsets) are loop invariants that get hoisted out of
// the tile loop and then stay live across the GEMMs, where the accumulators need every register; recomputed at
// each use they cost a few integer ops per tile and spill nothing.
#pragma once

namespace omni {

// threadIdx.x, re-read from the special register at each use.
__forceinline__ __device__ int fresh_thread_idx() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

// `x` (e.g. a thread index already computed), as a value the compiler cannot see through at each use.
__forceinline__ __device__ int unhoisted(int x) {
  int y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

}  // namespace omni
