// merge_slices (decode/split_kv.cuh): a CTA per query row, its warps taking every kWarps-th slice, each lane a run of
// D / 32 contiguous columns; the warps' sums meet in shared memory.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/half.cuh"
#include "common/softmax.cuh"
#include "decode/split_kv.cuh"
#include "host/dispatch.cuh"
#include "host/status.cuh"

namespace omni {
namespace {

constexpr int kWarps = 4;  // warps of a merge CTA, which split the row's slices

template <bool kBf16, int kDim>
__global__ void __launch_bounds__(32 * kWarps) merge_kernel(const OmniFwdParams p, const SplitPartials part) {
  constexpr int kPerLane = kDim / 32;
  static_assert(kDim % 32 == 0, "each lane takes kDim / 32 columns");
  __shared__ float o_s[kWarps][kDim];
  __shared__ float total_s[kWarps];
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.q_len;
  const int64_t n = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Every warp finds the max of the slices' LSEs (every 32nd slice to a lane), then sums its own slices.
  float lse_max = -INFINITY;
  for (int s = lane; s < part.slices; s += 32) lse_max = fmaxf(lse_max, part.lse[s * rows + n]);
  lse_max = warp_allreduce(lse_max, MaxOp{});
  float o[kPerLane] = {};
  float total = 0.f;
  if (lse_max != -INFINITY) {
    for (int s = warp; s < part.slices; s += kWarps) {
      const float w = expf(part.lse[s * rows + n] - lse_max);
      const float* o_slice = part.o + (s * rows + n) * kDim + lane * kPerLane;
      total += w;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) o[e] = fmaf(w, o_slice[e], o[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) o_s[warp][lane * kPerLane + e] = o[e];
  if (lane == 0) total_s[warp] = total;
  __syncthreads();
  if (warp > 0) return;
  total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += total_s[w];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    o[e] = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o[e] += o_s[w][lane * kPerLane + e];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const int query = static_cast<int>(n % p.q_len);
  const int64_t bh = n / p.q_len;
  const int head = static_cast<int>(bh % p.heads_q), b = static_cast<int>(bh / p.heads_q);
  Half<kBf16>* out = static_cast<Half<kBf16>*>(p.out.ptr) + b * p.out.stride_b + head * p.out.stride_h +
                     query * p.out.stride_s + lane * kPerLane;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    if (lane * kPerLane + e < p.head_dim) out[e] = Half<kBf16>(o[e] * inv);  // columns past head_dim are the kernel's
  }
  if (lane == 0) p.lse[n] = lse_max == -INFINITY ? -INFINITY : lse_max + logf(total);
}

template <bool kBf16>
int launch_merge(const OmniFwdParams& p, const SplitPartials& part) {
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.q_len;
  const dim3 grid(static_cast<unsigned>(rows));
  auto stream = static_cast<cudaStream_t>(p.stream);
  return dispatch_head_dim(
      p.head_dim,
      [&](auto head_dim) {
        if constexpr (decode_head_dim(head_dim())) {
          merge_kernel<kBf16, head_dim()><<<grid, 32 * kWarps, 0, stream>>>(p, part);
          return check_cuda(cudaGetLastError(), "merge_kernel launch");
        }
        return fail(OMNI_ERR_HEAD_DIM, "merge_slices: head_dim=%d", p.head_dim);
      },
      [&] { return fail(OMNI_ERR_HEAD_DIM, "merge_slices: head_dim=%d", p.head_dim); });
}

}  // namespace

size_t split_workspace_bytes(const OmniFwdParams& p, int slices) {
  if (slices <= 1) return 0;
  const size_t rows = static_cast<size_t>(p.batch) * p.heads_q * p.q_len;
  return slices * rows * (kernel_head_dim(p.head_dim) + 1) * sizeof(float);
}

int split_partials(const OmniFwdParams& p, int slices, SplitPartials* partials) {
  const size_t needed = split_workspace_bytes(p, slices);
  if (p.workspace == nullptr || p.workspace_bytes < needed)
    return fail(OMNI_ERR_WORKSPACE, "%d key slices need %zu bytes of workspace, got %zu", slices, needed,
                p.workspace == nullptr ? size_t{0} : p.workspace_bytes);
  partials->o = static_cast<float*>(p.workspace);
  const size_t rows = static_cast<size_t>(p.batch) * p.heads_q * p.q_len;
  partials->lse = partials->o + slices * rows * kernel_head_dim(p.head_dim);
  partials->slices = slices;
  return OMNI_OK;
}

int merge_slices(const OmniFwdParams& p, const SplitPartials& partials) {
  return p.dtype == OMNI_BF16 ? launch_merge<true>(p, partials) : launch_merge<false>(p, partials);
}

}  // namespace omni
