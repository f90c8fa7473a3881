// merge_slices (decode/split_kv.cuh): one warp per query row, each lane a run of D / 32 contiguous columns.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/half.cuh"
#include "decode/split_kv.cuh"
#include "host/dispatch.cuh"
#include "host/status.cuh"

namespace omni {
namespace {

constexpr int kRowsPerCta = 4;  // warps of a merge CTA

template <bool kBf16, int kDim>
__global__ void __launch_bounds__(32 * kRowsPerCta) merge_kernel(const OmniFwdParams p, const SplitPartials part) {
  constexpr int kPerLane = kDim / 32;
  static_assert(kDim % 32 == 0, "each lane takes kDim / 32 columns");
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads_q * p.q_len;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / 32;
  if (n >= rows) return;
  const int lane = threadIdx.x % 32;
  float lse_max = -INFINITY;
  for (int s = 0; s < part.slices; ++s) lse_max = fmaxf(lse_max, part.lse[s * rows + n]);
  float o[kPerLane] = {};
  float total = 0.f;
  if (lse_max != -INFINITY) {
    for (int s = 0; s < part.slices; ++s) {
      const float w = expf(part.lse[s * rows + n] - lse_max);
      const float* o_s = part.o + (s * rows + n) * kDim + lane * kPerLane;
      total += w;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) o[e] = fmaf(w, o_s[e], o[e]);
    }
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
  const dim3 grid(static_cast<unsigned>((rows + kRowsPerCta - 1) / kRowsPerCta));
  auto stream = static_cast<cudaStream_t>(p.stream);
  return dispatch_head_dim(
      p.head_dim,
      [&](auto head_dim) {
        if constexpr (decode_head_dim(head_dim())) {
          merge_kernel<kBf16, head_dim()><<<grid, 32 * kRowsPerCta, 0, stream>>>(p, part);
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
