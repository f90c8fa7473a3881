// The decode path (decode/decode.cuh): split-KV attention for few query rows per KV head, implicit masks.
//
// slice_kernel, grid (slices, heads_kv, batch), 128 threads: the R = q_len * group query rows of one KV head
// (row r is query i = r / group of head hk * group + r % group) against one slice of the keys, 128 keys per step:
//   scores   thread t takes key t of the step and dots it with every row (q in shared memory, fp32);
//   softmax  per-row running max over the steps (base 2, as softmax.cuh), probabilities to shared memory;
//   P.V      thread t takes the column pair t % L for the keys t / L + k * (128 / L) of the step, L being D / 2
//            rounded up to a power of two (the last 16 of 64 lanes idle at D = 96).
// All the global loads of a step (a K row and a V column pair per thread) are issued together at its start.
// Each slice ends with its rows normalised by their own sums: written as the output when the keys are not split,
// else as fp32 partials that merge_slices (decode/split_kv.cuh) combines.
// Rows with no allowed key give o = 0, lse = -inf, as everywhere. A call's head_dim may be below kDim (the
// instantiation that runs it, host/dispatch.cuh): columns past it read as zeros and are not written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode/decode.cuh"
#include "common/half.cuh"
#include "common/mask_rule.cuh"
#include "decode/split_kv.cuh"
#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/status.cuh"
#include "host/tuning.cuh"

namespace omni::decode {
namespace {

constexpr int kThreads = 128;
constexpr int kStepKeys = kThreads;  // keys per step: one per thread in the score phase

// The split of one call: `slices` CTAs per (batch, KV head), each taking `steps` steps of keys from `first_key`.
struct Plan {
  int first_key, num_keys;  // keys any row may see (implicit_key_range over the call's rows)
  int slices, steps;
};

struct SliceParams {
  OmniFwdParams p;
  Plan plan;
  int group;               // heads_q / heads_kv
  SplitPartials partials;  // where slices write when there are several (decode/split_kv.cuh)
};

__device__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Lanes that share the P.V phase's column pairs of one key group: kPairs rounded up to a power of two.
constexpr int pair_lanes(int pairs) { return pairs <= 1 ? 1 : 2 * pair_lanes((pairs + 1) / 2); }

// Row r of the CTA: its query head and query index.
struct Row {
  int head, query;
};
__device__ Row row_of(int r, int hk, int group) { return {hk * group + r % group, r / group}; }

template <bool kBf16, int kDim, int kRows>
__global__ void __launch_bounds__(kThreads) slice_kernel(const SliceParams sp) {
  using T = Half<kBf16>;
  using T2 = Half2<kBf16>;
  constexpr int kPairs = kDim / 2;                        // column pairs of the P.V phase
  constexpr int kPairLanes = pair_lanes(kPairs);            // threads per key group, kPairs of them busy
  constexpr int kKeyGroups = kThreads / kPairLanes;         // keys of a step taken at once in the P.V phase
  constexpr int kKeysPerThread = kStepKeys / kKeyGroups;
  static_assert(kThreads % kPairLanes == 0, "the P.V phase gives each thread one column pair of one key group");
  const OmniFwdParams& p = sp.p;
  const int slice = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int rows = p.q_len * sp.group;
  const bool softcap = p.softcap > 0.f;

  __shared__ float q_s[kRows][kDim];            // q, pre-scaled (see below)
  __shared__ float p_s[kRows][kStepKeys];       // probabilities of the step
  __shared__ float warp_max_s[kThreads / 32][kRows];
  __shared__ float row_max_s[kRows], rescale_s[kRows];
  __shared__ float sum_s[kKeyGroups][kRows];
  __shared__ float acc_s[kKeyGroups][kRows][kDim];  // the key groups' P.V sums, added at the end

  // Without softcap the exponent is s * scale * log2(e); with it, softcap * log2(e) * tanh(s * scale / softcap).
  const float q_scale = softcap ? p.scale / p.softcap : p.scale * float(M_LOG2E);
  const float exp_scale = softcap ? p.softcap * float(M_LOG2E) : 1.f;
  for (int idx = tid; idx < kRows * kDim; idx += kThreads) {
    const int r = idx / kDim, d = idx % kDim;
    float x = 0.f;
    if (r < rows && d < p.head_dim) {  // the kernel's columns past head_dim are zeros
      const Row row = row_of(r, hk, sp.group);
      const T* q = static_cast<const T*>(p.q.ptr) + b * p.q.stride_b + row.head * p.q.stride_h + row.query * p.q.stride_s;
      x = float(q[d]) * q_scale;
    }
    q_s[r][d] = x;
  }
  if (tid < kRows) row_max_s[tid] = -INFINITY;

  const T* k_head = static_cast<const T*>(p.k.ptr) + b * p.k.stride_b + hk * p.k.stride_h;
  const T* v_head = static_cast<const T*>(p.v.ptr) + b * p.v.stride_b + hk * p.v.stride_h;
  const int offset = p.kv_len - p.q_len;  // bottom-right alignment
  const int pair = tid % kPairLanes, key_group = tid / kPairLanes;
  const bool has_pair = pair < kPairs;
  const bool reads_pair = has_pair && 2 * pair < p.head_dim;
  float acc[kRows][2] = {};
  float sum[kRows] = {};

  const int key_end = sp.plan.first_key + sp.plan.num_keys;
  const int slice_first = sp.plan.first_key + slice * sp.plan.steps * kStepKeys;
  for (int step = 0; step < sp.plan.steps; ++step) {
    const int base = slice_first + step * kStepKeys;
    if (base >= key_end) break;
    // Every load of the step first (so that they are in flight together): this thread's key row of K for the
    // scores and its column pair of V for the keys it sums in the P.V phase (zeros past the slice's keys).
    const int j = base + tid;
    const int step_keys = min_int(kStepKeys, key_end - base);
    uint4 k_vec[kDim / 8];
    T2 v_pair[kKeysPerThread];
    const uint4* k_row = reinterpret_cast<const uint4*>(k_head + static_cast<int64_t>(j) * p.k.stride_s);
#pragma unroll
    for (int c = 0; c < kDim / 8; ++c) {
      k_vec[c] = j < key_end && c * 8 < p.head_dim ? k_row[c] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) {
      const int jj = key_group + i * kKeyGroups;
      v_pair[i] = reads_pair && jj < step_keys
                      ? reinterpret_cast<const T2*>(v_head + static_cast<int64_t>(base + jj) * p.v.stride_s)[pair]
                      : T2(T(0.f), T(0.f));
    }
    __syncthreads();  // q_s written / the previous step's p_s and row_max_s read
    // Scores of key j against every row.
    float s[kRows] = {};
#pragma unroll
    for (int c = 0; c < kDim / 8; ++c) {
      const T2* h = reinterpret_cast<const T2*>(&k_vec[c]);
      float kf[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = to_float2(h[e]);
        kf[2 * e] = f.x;
        kf[2 * e + 1] = f.y;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int e = 0; e < 8; ++e) s[r] = fmaf(q_s[r][c * 8 + e], kf[e], s[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool allowed = r < rows && j < key_end && implicit_allowed(p.mask, row_of(r, hk, sp.group).query + offset, j);
      s[r] = !allowed ? -INFINITY : softcap ? tanhf(s[r]) * exp_scale : s[r];
      const float m = warp_max(s[r]);
      if (tid % 32 == 0) warp_max_s[tid / 32][r] = m;
    }
    __syncthreads();
    if (tid < kRows) {
      float m = row_max_s[tid];
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max_s[w][tid]);
      // A row still without an allowed key keeps max -inf; its rescale is irrelevant (everything is 0).
      rescale_s[tid] = m == -INFINITY ? 1.f : exp2f(row_max_s[tid] - m);
      row_max_s[tid] = m;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float m = row_max_s[r];
      p_s[r][tid] = m == -INFINITY ? 0.f : exp2f(s[r] - m);
    }
    __syncthreads();
    // P.V of the step.
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float rescale = rescale_s[r];
      acc[r][0] *= rescale;
      acc[r][1] *= rescale;
      sum[r] *= rescale;
    }
#pragma unroll
    for (int i = 0; i < kKeysPerThread; ++i) {
      const int jj = key_group + i * kKeyGroups;  // past step_keys: p = 0 and v = 0
      const float2 v = to_float2(v_pair[i]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float pr = p_s[r][jj];
        acc[r][0] = fmaf(pr, v.x, acc[r][0]);
        acc[r][1] = fmaf(pr, v.y, acc[r][1]);
        sum[r] += pr;
      }
    }
  }

  // Add up the key groups.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (has_pair) {
      acc_s[key_group][r][2 * pair] = acc[r][0];
      acc_s[key_group][r][2 * pair + 1] = acc[r][1];
    }
  }
  if (pair == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) sum_s[key_group][r] = sum[r];
  }
  __syncthreads();
  const int64_t rows_total = static_cast<int64_t>(p.batch) * p.heads_q * p.q_len;
  for (int idx = tid; idx < rows * kDim; idx += kThreads) {
    const int r = idx / kDim, d = idx % kDim;
    float o = 0.f, l = 0.f;
#pragma unroll
    for (int g = 0; g < kKeyGroups; ++g) {
      o += acc_s[g][r][d];
      l += sum_s[g][r];
    }
    const bool empty = l == 0.f;
    o = empty ? 0.f : o / l;
    const float lse = empty ? -INFINITY : (row_max_s[r] + log2f(l)) * float(M_LN2);
    const Row row = row_of(r, hk, sp.group);
    const int64_t n = (static_cast<int64_t>(b) * p.heads_q + row.head) * p.q_len + row.query;
    if (sp.plan.slices == 1) {
      T* out = static_cast<T*>(p.out.ptr) + b * p.out.stride_b + row.head * p.out.stride_h + row.query * p.out.stride_s;
      if (d < p.head_dim) out[d] = T(o);
      if (d == 0) p.lse[n] = lse;
    } else {
      sp.partials.o[(slice * rows_total + n) * kDim + d] = o;
      if (d == 0) sp.partials.lse[slice * rows_total + n] = lse;
    }
  }
}

// Slices so that about tuning::kDecodeCtasPerSm CTAs per multiprocessor run, never a step of keys split, none empty.
Plan plan(const OmniFwdParams& p) {
  const BlockSpan keys = implicit_key_range(p.mask, p.kv_len - p.q_len, p.kv_len - 1, p.kv_len);
  Plan plan{keys.first, max_int(keys.count, 0), 1, 0};
  const int total_steps = (plan.num_keys + kStepKeys - 1) / kStepKeys;
  if (total_steps == 0) return plan;
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.heads_kv;  // CTAs per slice
  const int64_t wanted =
      std::min<int64_t>(total_steps, (tuning::kDecodeCtasPerSm * multiprocessors() + ctas - 1) / ctas);  // >= 1
  plan.steps = static_cast<int>((total_steps + wanted - 1) / wanted);
  plan.slices = (total_steps + plan.steps - 1) / plan.steps;
  return plan;
}

template <bool kBf16, int kDim, int kRows>
int launch(const SliceParams& sp) {
  const OmniFwdParams& p = sp.p;
  const dim3 grid(sp.plan.slices, p.heads_kv, p.batch);
  auto stream = static_cast<cudaStream_t>(p.stream);
  slice_kernel<kBf16, kDim, kRows><<<grid, kThreads, 0, stream>>>(sp);
  if (int s = check_cuda(cudaGetLastError(), "decode slice_kernel launch")) return s;
  return sp.plan.slices == 1 ? OMNI_OK : merge_slices(p, sp.partials);
}

template <bool kBf16, int kDim>
int launch_rows(const SliceParams& sp, int rows) {
  if (rows <= 4) return launch<kBf16, kDim, 4>(sp);
  if (rows <= 8) return launch<kBf16, kDim, 8>(sp);
  return launch<kBf16, kDim, kMaxRows>(sp);
}

}  // namespace

size_t workspace_bytes(const OmniFwdParams& p) { return split_workspace_bytes(p, plan(p).slices); }

int run(const OmniFwdParams& p) {
  SliceParams sp{p, plan(p), p.heads_q / p.heads_kv, {}};
  if (sp.plan.slices > 1) {
    if (int s = split_partials(p, sp.plan.slices, &sp.partials)) return s;
  }
  const int rows = p.q_len * sp.group;
  return dispatch_head_dim(
      p.head_dim,
      [&](auto head_dim) {
        if constexpr (decode_head_dim(head_dim())) {
          return p.dtype == OMNI_BF16 ? launch_rows<true, head_dim()>(sp, rows)
                                      : launch_rows<false, head_dim()>(sp, rows);
        }
        return fail(OMNI_ERR_HEAD_DIM, "decode: head_dim=%d", p.head_dim);
      },
      [&] { return fail(OMNI_ERR_HEAD_DIM, "decode: head_dim=%d", p.head_dim); });
}

}  // namespace omni::decode
