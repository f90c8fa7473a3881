// threadIdx.x as a value the compiler must re-read where it is used. Per-thread offsets derived from the
// plain threadIdx.x (fragment coordinates, swizzled smem addresses, gmem copy offsets) are loop invariants
// that get hoisted out of the tile loop and then stay live across the GEMMs, where the accumulators need
// every register; recomputed at each use they cost a few integer ops per tile and spill nothing.
#pragma once

namespace omni {

__forceinline__ __device__ int fresh_thread_idx() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

}  // namespace omni
