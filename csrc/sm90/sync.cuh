// Synchronisation shared by the sm_90a kernels: the transaction mbarriers of the producer -> consumer ring, the
// producer warp's arrival protocol after staging mask data, and named barriers among consumer threads.
#pragma once
#include <cutlass/arch/barrier.h>

namespace omni::sm90 {

using Barrier = cutlass::arch::ClusterTransactionBarrier;

// Each producer lane arrives twice on a "full" barrier after staging token ids: once when its cp.async copies
// land, once (release) for the plain stores that filled positions outside the ids. With lane 0's arrive that
// announces the TMA bytes, a full barrier expects 65 arrivals.
constexpr int kFullArrivals = 1 + 2 * 32;

__forceinline__ __device__ void arrive_after_staging(uint64_t* bar) {
  cutlass::arch::cpasync_barrier_arrive_noinc(bar);
  Barrier::arrive(bar);
}

// Named barriers (id 0 is __syncthreads). Both are warp-aligned: every thread of a warp takes the same one.
__forceinline__ __device__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__forceinline__ __device__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace omni::sm90
