// The decode path (decode/decode.cuh): split-KV attention for few query rows per KV head, implicit masks.
//
// slice_kernel, grid (slices, heads_kv, batch), 4 warps: the R = q_len * group <= 16 query rows of one KV head
// (row r is query i = r / group of head hk * group + r % group; rows past R are zeros) against one slice of the
// keys, on the tensor cores (mma.sync m16n8k16, one 16-row tile: the rows are the MMA's M).
//   The keys stream through a kStages-deep ring of kTileKeys-key tiles of K and V in shared memory (cp.async,
//   16-byte coalesced rows, zero-filled past the slice), so kStages - 1 tiles are in flight while one computes.
//   Warp w takes keys [16 w, 16 w + 16) of every tile: S = Q K^T (Q's fragment loaded once), the mask by the
//   implicit rule, its own online softmax (common/softmax.cuh), O += P V with P straight from registers.
//   At the end the four warps' (max, sum, O) are merged through shared memory.
// Each slice ends with its rows normalised by their own sums: written as the output when the keys are not split,
// else as fp32 partials that merge_slices (decode/split_kv.cuh) combines.
// Rows with no allowed key give o = 0, lse = -inf, as everywhere. A call's head_dim may be below kDim (the
// instantiation that runs it, host/dispatch.cuh): columns past it read as zeros and are not written.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode/decode.cuh"
#include "common/fragment.cuh"
#include "common/mask_rule.cuh"
#include "common/softmax.cuh"
#include "common/tile_copy.cuh"
#include "decode/split_kv.cuh"
#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/status.cuh"
#include "sm80/kernel_traits.cuh"
#include "sm80/mma.cuh"

namespace omni::decode {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpKeys = 16;                   // keys of a tile per warp: one k16 slice of P.V
constexpr int kTileKeys = kWarpKeys * kWarps;   // keys per tile, the plan's unit
constexpr int kStages = 3;                      // tiles in the ring: two load while one computes
constexpr int kMaxSlices = 32;  // beyond, more slices of fewer keys gain less than the merge and the starts cost

// The split of one call: `slices` CTAs per (batch, KV head), each taking `tiles` tiles of keys from `first_key`.
struct Plan {
  int first_key, num_keys;  // keys any row may see (implicit_key_range over the call's rows)
  int slices, tiles;
};

struct SliceParams {
  OmniFwdParams p;
  Plan plan;
  int group;               // heads_q / heads_kv
  SplitPartials partials;  // where slices write when there are several (decode/split_kv.cuh)
};

// Row r of the CTA: its query head and query index.
struct Row {
  int head, query;
};
__device__ Row row_of(int r, int hk, int group) { return {hk * group + r % group, r / group}; }

// One warp's MMA (16 rows, the sm_80 kernels' atoms and swizzled layouts), the ring of K / V tiles, the Q tile,
// and the 128-thread cp.async copy of a tile.
template <typename Element, int kDim>
struct DecodeTraits : Sm80Base<Element, kDim, 1> {
  using Base = Sm80Base<Element, kDim, 1>;
  using SmemLayoutQ = typename Base::template SmemLayoutRows<kMaxRows>;
  using SmemLayoutKV =
      decltype(tile_to_shape(typename Base::SmemLayoutAtomHeadDim{}, Shape<Int<kTileKeys>, Int<kDim>, Int<kStages>>{}));
  // The ring's V tiles as [kDim, kTileKeys, kStages]: the B operand of P.V, read by ldmatrix.trans.
  using SmemLayoutVt =
      decltype(composition(SmemLayoutKV{}, make_layout(Shape<Int<kDim>, Int<kTileKeys>, Int<kStages>>{},
                                                       make_stride(Int<kTileKeys>{}, _1{}, Int<kTileKeys * kDim>{}))));
  using GmemTiledLoad =
      decltype(make_tiled_copy(Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element>{},
                               Layout<Shape<Int<kThreads / Base::kGmemThreadsPerRow>, Int<Base::kGmemThreadsPerRow>>,
                                      Stride<Int<Base::kGmemThreadsPerRow>, _1>>{},
                               Layout<Shape<_1, _8>>{}));
  static constexpr int kSmemKVElems = decltype(cosize(SmemLayoutKV{}))::value;
  static constexpr int kSmemQElems = decltype(cosize(SmemLayoutQ{}))::value;
  static constexpr int kSmemBytes = (kSmemQElems + 2 * kSmemKVElems) * sizeof(Element);
  // The epilogue's merge reuses the ring for each warp's O (fp32, kMaxRows x kDim).
  static_assert(kWarps * kMaxRows * kDim * sizeof(float) <= 2 * kSmemKVElems * sizeof(Element),
                "the warps' O must fit in the ring");
};

template <typename Element, int kDim>
__global__ void __launch_bounds__(kThreads) slice_kernel(const __grid_constant__ SliceParams sp) {
  using Traits = DecodeTraits<Element, kDim>;
  const OmniFwdParams& p = sp.p;
  const int slice = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int rows = p.q_len * sp.group;
  const bool softcap = p.softcap > 0.f;

  extern __shared__ __align__(128) char smem[];
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Traits::SmemLayoutQ{});
  Element* smem_k = smem_q + Traits::kSmemQElems;
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(smem_k + Traits::kSmemKVElems), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});

  // The slice's tiles, into the ring by cp.async: keys past key_end and columns past head_dim are zeros.
  const int key_end = sp.plan.first_key + sp.plan.num_keys;
  const int slice_first = sp.plan.first_key + slice * sp.plan.tiles * kTileKeys;
  const int tiles = min_int(sp.plan.tiles, (key_end - slice_first + kTileKeys - 1) / kTileKeys);
  typename Traits::GmemTiledLoad load_op;
  auto load_thr = load_op.get_thread_slice(tid);
  const auto load_coord = load_thr.partition_S(make_identity_tensor(Shape<Int<kTileKeys>, Int<kDim>>{}));
  auto load_rows_of = [&](const OmniTensor& src, auto&& dst, int key0) {
    const Element* ptr =
        static_cast<const Element*>(src.ptr) + b * src.stride_b + hk * src.stride_h + int64_t(key0) * src.stride_s;
    Tensor g = make_tensor(make_gmem_ptr(ptr), Shape<Int<kTileKeys>, Int<kDim>>{}, make_stride(src.stride_s, _1{}));
    load_rows<kTileKeys, kDim>(load_op, load_thr.partition_S(g), load_thr.partition_D(dst), load_coord, key_end - key0,
                               p.head_dim);
  };
  auto load_tile = [&](int t) {
    const int key0 = slice_first + t * kTileKeys;
    load_rows_of(p.k, sK(_, _, t % kStages), key0);
    load_rows_of(p.v, sV(_, _, t % kStages), key0);
  };
  CUTE_UNROLL
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles) load_tile(t);
    cp_async_fence();
  }

  // Q: row r of the tile from its head and query, zeros past the rows and head_dim.
  for (int idx = tid; idx < kMaxRows * kDim; idx += kThreads) {
    const int r = idx / kDim, d = idx % kDim;
    Element x = Element(0.f);
    if (r < rows && d < p.head_dim) {
      const Row row = row_of(r, hk, sp.group);
      const Element* q = static_cast<const Element*>(p.q.ptr);
      x = q[b * p.q.stride_b + row.head * p.q.stride_h + row.query * p.q.stride_s + d];
    }
    sQ(r, d) = x;
  }
  __syncthreads();

  typename Traits::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(lane);
  auto copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma);
  auto copy_k = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma);
  auto copy_v = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  copy(copy_q, copy_q.get_thread_slice(lane).partition_S(sQ), retile(copy_q, tSrQ));
  // This warp's keys of a tile: K as [16, kDim], V^T as [kDim, 16].
  auto warp_k = [&](int stage) {
    return local_tile(sK(_, _, stage), Shape<Int<kWarpKeys>, Int<kDim>>{}, make_coord(warp, _0{}));
  };
  auto warp_vt = [&](int stage) {
    return local_tile(sVt(_, _, stage), Shape<Int<kDim>, Int<kWarpKeys>>{}, make_coord(_0{}, warp));
  };
  Tensor tSrK = thr_mma.partition_fragment_B(make_tensor(sK.data(), Shape<Int<kWarpKeys>, Int<kDim>>{}));
  Tensor tOrVt = thr_mma.partition_fragment_B(make_tensor(sV.data(), Shape<Int<kDim>, Int<kWarpKeys>>{}));
  Tensor acc_o = partition_fragment_C(mma, Shape<Int<kMaxRows>, Int<kDim>>{});
  clear(acc_o);
  const Tensor cS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kMaxRows>, Int<kWarpKeys>>{}));
  auto c_rc = rowcol(cS);
  const int offset = p.kv_len - p.q_len;  // bottom-right alignment
  const float scale_log2 = softmax_scale_log2(p, softcap);
  OnlineSoftmax<decltype(size<0>(rowcol(acc_o)))::value> softmax;

  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile t visible; every warp done with tile t - 1, whose stage the next load takes
    if (t + kStages - 1 < tiles) load_tile(t + kStages - 1);
    cp_async_fence();

    const int stage = t % kStages;
    Tensor acc_s = partition_fragment_C(mma, Shape<Int<kMaxRows>, Int<kWarpKeys>>{});
    clear(acc_s);
    gemm_rs(acc_s, tSrQ, tSrK, copy_k.get_thread_slice(lane).partition_S(warp_k(stage)), mma, copy_k);
    if (softcap) apply_softcap(acc_s, p.scale / p.softcap);
    auto s_rc = rowcol(acc_s);
    const int key0 = slice_first + t * kTileKeys + warp * kWarpKeys;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(s_rc); ++i) {
      const int r = get<0>(c_rc(i, 0));
      const int qpos = r / sp.group + offset;
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s_rc); ++j) {
        const int key = key0 + get<1>(c_rc(i, j));
        if (!(r < rows && key < key_end && implicit_allowed(p.mask, qpos, key))) s_rc(i, j) = -INFINITY;
      }
    }
    auto o_rc = rowcol(acc_o);
    softmax.update(s_rc, o_rc, scale_log2);
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_a_operand_layout(rP.layout()));
    gemm_rs(acc_o, tOrP, tOrVt, copy_v.get_thread_slice(lane).partition_S(warp_vt(stage)), mma, copy_v);
  }

  // Merge the warps: each row's max M over the warps (log2 units), the warps' O and sums rescaled to it.
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: it takes the warps' O
  float* o_s = reinterpret_cast<float*>(smem_k);  // [kWarps][kMaxRows][kDim]
  __shared__ float max_s[kWarps][kMaxRows], sum_s[kWarps][kMaxRows];
  auto o_rc = rowcol(acc_o);
  auto co_rc = rowcol(thr_mma.partition_C(make_identity_tensor(Shape<Int<kMaxRows>, Int<kDim>>{})));
  CUTE_UNROLL
  for (int i = 0; i < size<0>(o_rc); ++i) {
    const float sum = quad_allreduce(softmax.row_sum[i], SumOp{});
    const int r = get<0>(co_rc(i, 0));
    if (lane % 4 == 0) {
      max_s[warp][r] = softmax.row_max[i] == -INFINITY ? -INFINITY : softmax.row_max[i] * scale_log2;
      sum_s[warp][r] = sum;
    }
  }
  __syncthreads();
  CUTE_UNROLL
  for (int i = 0; i < size<0>(o_rc); ++i) {
    const int r = get<0>(co_rc(i, 0));
    float m = -INFINITY;
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, max_s[w][r]);
    const float own = max_s[warp][r] == -INFINITY ? 0.f : exp2f(max_s[warp][r] - m);
    CUTE_UNROLL
    for (int j = 0; j < size<1>(o_rc); ++j) o_s[(warp * kMaxRows + r) * kDim + get<1>(co_rc(i, j))] = o_rc(i, j) * own;
  }
  __syncthreads();

  const int64_t rows_total = static_cast<int64_t>(p.batch) * p.heads_q * p.q_len;
  for (int idx = tid; idx < rows * kDim; idx += kThreads) {
    const int r = idx / kDim, d = idx % kDim;
    float m = -INFINITY;
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, max_s[w][r]);
    const Row row = row_of(r, hk, sp.group);
    // The sink joins the denominator of the whole row, so it is added by the slice that holds the row's first
    // keys; the merge of the slices' partials then counts it once.
    const float sink = slice == 0 ? sink_log2(p, row.head) : -INFINITY;
    float o = 0.f, l = 0.f;
    CUTE_UNROLL
    for (int w = 0; w < kWarps; ++w) {
      o += o_s[(w * kMaxRows + r) * kDim + d];
      l += max_s[w][r] == -INFINITY ? 0.f : sum_s[w][r] * exp2f(max_s[w][r] - m);
    }
    const RowNorm norm = normalise_row(m, l, sink);
    o *= norm.inv;
    const float lse = norm.lse;
    const int64_t n = (static_cast<int64_t>(b) * p.heads_q + row.head) * p.q_len + row.query;
    if (sp.plan.slices == 1) {
      Element* out = static_cast<Element*>(p.out.ptr) + b * p.out.stride_b + row.head * p.out.stride_h +
                     row.query * p.out.stride_s;
      if (d < p.head_dim) out[d] = Element(o);
      if (d == 0) p.lse[n] = lse;
    } else {
      sp.partials.o[(slice * rows_total + n) * kDim + d] = o;
      if (d == 0) sp.partials.lse[slice * rows_total + n] = lse;
    }
  }
}

// The slice kernel's instantiation for a call: f(Element{}, std::integral_constant<int, kDim>{}), else an error.
template <typename F>
int with_instantiation(const OmniFwdParams& p, F&& f) {
  return dispatch_head_dim(
      p.head_dim,
      [&](auto head_dim) {
        if constexpr (decode_head_dim(head_dim())) {
          return p.dtype == OMNI_BF16 ? f(cutlass::bfloat16_t{}, head_dim) : f(cutlass::half_t{}, head_dim);
        }
        return fail(OMNI_ERR_HEAD_DIM, "decode: head_dim=%d", p.head_dim);
      },
      [&] { return fail(OMNI_ERR_HEAD_DIM, "decode: head_dim=%d", p.head_dim); });
}

// The slices of a call: at most one wave of CTAs, as many per multiprocessor as the kernel's shared memory and
// registers let reside (`resident`; more would start a second wave that runs alone), at most kMaxSlices per
// (batch, KV head), each a whole number of tiles, none empty.
Plan plan(const OmniFwdParams& p, int resident) {
  const BlockSpan keys = implicit_key_range(p.mask, p.kv_len - p.q_len, p.kv_len - 1, p.kv_len);
  Plan plan{keys.first, max_int(keys.count, 0), 1, 0};
  const int total_tiles = (plan.num_keys + kTileKeys - 1) / kTileKeys;
  if (total_tiles == 0) return plan;
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.heads_kv;  // CTAs per slice
  const int64_t slots = static_cast<int64_t>(resident) * multiprocessors();
  const int64_t wanted = std::clamp<int64_t>(std::min<int64_t>(slots / ctas, kMaxSlices), 1, total_tiles);
  plan.tiles = static_cast<int>((total_tiles + wanted - 1) / wanted);
  plan.slices = (total_tiles + plan.tiles - 1) / plan.tiles;
  return plan;
}

// The plan of a call on its instantiation, after letting the kernel have its shared memory; OMNI_OK or a status.
template <typename Element, int kDim>
int plan_for(const OmniFwdParams& p, Plan* out) {
  auto kernel = slice_kernel<Element, kDim>;
  constexpr int kSmem = DecodeTraits<Element, kDim>::kSmemBytes;
  if (int s = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kSmem, "decode slice_kernel")) return s;
  int resident = 0;
  if (int s = resident_ctas(reinterpret_cast<const void*>(kernel), kThreads, kSmem, &resident)) return s;
  *out = plan(p, resident);
  return OMNI_OK;
}

template <typename Element, int kDim>
int launch(const OmniFwdParams& p) {
  SliceParams sp{p, {}, p.heads_q / p.heads_kv, {}};
  if (int s = plan_for<Element, kDim>(p, &sp.plan)) return s;
  if (sp.plan.slices > 1) {
    if (int s = split_partials(p, sp.plan.slices, &sp.partials)) return s;
  }
  const dim3 grid(sp.plan.slices, p.heads_kv, p.batch);
  constexpr int kSmem = DecodeTraits<Element, kDim>::kSmemBytes;
  slice_kernel<Element, kDim><<<grid, kThreads, kSmem, static_cast<cudaStream_t>(p.stream)>>>(sp);
  if (int s = check_cuda(cudaGetLastError(), "decode slice_kernel launch")) return s;
  return sp.plan.slices == 1 ? OMNI_OK : merge_slices(p, sp.partials);
}

}  // namespace

size_t workspace_bytes(const OmniFwdParams& p) {
  Plan plan{};
  const int s = with_instantiation(
      p, [&](auto element, auto dim) { return plan_for<decltype(element), decltype(dim)::value>(p, &plan); });
  return s == OMNI_OK ? split_workspace_bytes(p, plan.slices) : 0;
}

int run(const OmniFwdParams& p) {
  return with_instantiation(p,
                            [&](auto element, auto dim) { return launch<decltype(element), decltype(dim)::value>(p); });
}

}  // namespace omni::decode
