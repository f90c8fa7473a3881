// omni_build_token_mask: the token-rule block lists of omni_hf.mask.OmniBlockMask.from_token_ids, and its token
// ranges, in four launches instead of ~100 small PyTorch ops (the build is launch-bound on a GPU).
//
//   1. summarise_blocks: one warp per Q block and per KV block reduces its ids to six ints (least id >= 0,
//      greatest id, key; for documents, then groups), as _TokenSummary does.
//   2. write_lists: one warp per row of each view classifies its (Q block, KV block) pairs from the
//      summaries, as _classify_token_blocks does, and compacts the active ones with a ballot.
//   3. summarise_chunks, write_ranges: the token ranges (omni_hf/mask/token_ranges.py), see below.
#include <climits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "host/dispatch.cuh"
#include "host/status.cuh"

namespace omni {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerCta = 4;
constexpr unsigned kAllLanes = 0xffffffffu;

// The six summary ints of one block, in workspace order.
struct BlockSummary {
  int doc_least, doc_greatest, doc_key, grp_least, grp_greatest, grp_key;
};

// Geometry shared by both kernels: block counts and each block's first / last absolute position.
struct Blocks {
  int q_len, kv_len, block_q, block_kv, num_q, num_kv;

  __device__ int offset() const { return kv_len - q_len; }
  __device__ int q_first(int qb) const { return qb * block_q + offset(); }
  __device__ int q_last(int qb) const { return min(qb * block_q + block_q, q_len) - 1 + offset(); }
  __device__ int k_first(int kb) const { return kb * block_kv; }
  __device__ int k_last(int kb) const { return min(kb * block_kv + block_kv, kv_len) - 1; }
};

// Least non-negative id (INT_MAX if none), greatest id, and the block's one id when all its ids are one
// value >= 0, else a negative key no other block has (`unique`).
__device__ void reduce_ids(int least, int smallest, int greatest, int unique, int* out) {
  least = __reduce_min_sync(kAllLanes, least);
  smallest = __reduce_min_sync(kAllLanes, smallest);
  greatest = __reduce_max_sync(kAllLanes, greatest);
  out[0] = least;
  out[1] = greatest;
  out[2] = (smallest == greatest && greatest >= 0) ? greatest : unique;
}

// Both kernels run one warp per block of a batch row, Q blocks first, then KV blocks: warp w takes block
// w % (num_q + num_kv) of batch row w / (num_q + num_kv), which is also its summary's index in the workspace.
struct WarpItem {
  int warp, lane, b;
  bool is_q;    // a Q block (else a KV block)
  int index;    // the block's index on its side
  bool active;  // false for the spare warps of the last CTA
};

__device__ WarpItem warp_item(const Blocks& g, int batch) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp;
  const int per_row = g.num_q + g.num_kv;
  const int block = warp % per_row;
  const bool is_q = block < g.num_q;
  return {warp, static_cast<int>(threadIdx.x % kWarp), warp / per_row,
          is_q, is_q ? block : block - g.num_q,        warp < batch * per_row};
}

// Summaries of Q blocks cover the last q_len positions. Group ids count only where doc >= 0.
__global__ void summarise_blocks(const int32_t* __restrict__ doc_ids, const int32_t* __restrict__ group_ids, Blocks g,
                                 int batch, int32_t* __restrict__ workspace) {
  const WarpItem item = warp_item(g, batch);
  if (!item.active) return;
  const int b = item.b, lane = item.lane, index = item.index;
  const bool is_q = item.is_q;
  const int first = is_q ? g.q_first(index) : g.k_first(index);
  const int last = is_q ? g.q_last(index) : g.k_last(index);
  const int32_t* doc = doc_ids + static_cast<int64_t>(b) * g.kv_len;
  const int32_t* grp = group_ids + static_cast<int64_t>(b) * g.kv_len;
  int d_least = INT_MAX, d_min = INT_MAX, d_max = INT_MIN, g_least = INT_MAX, g_min = INT_MAX, g_max = INT_MIN;
  for (int p = first + lane; p <= last; p += kWarp) {
    const int d = doc[p];
    const int gr = grp[p] | (d >> 31);  // -1 wherever the token is padding
    d_least = min(d_least, d & INT_MAX);
    d_min = min(d_min, d);
    d_max = max(d_max, d);
    g_least = min(g_least, gr & INT_MAX);
    g_min = min(g_min, gr);
    g_max = max(g_max, gr);
  }
  const int unique = -1 - (is_q ? 0 : 1) - 2 * index;
  int summary[6];
  reduce_ids(d_least, d_min, d_max, unique, summary);
  reduce_ids(g_least, g_min, g_max, unique, summary + 3);
  if (lane < 6) workspace[static_cast<int64_t>(item.warp) * OMNI_TOKEN_SUMMARY_INTS + lane] = summary[lane];
}

__device__ BlockSummary load_summary(const int32_t* workspace, int64_t block) {
  const int32_t* s = workspace + block * OMNI_TOKEN_SUMMARY_INTS;
  return {s[0], s[1], s[2], s[3], s[4], s[5]};
}

// The OmniBlockType of (qb, kb): MASKED where no pair can be allowed, FULL / CAUSAL where the claim holds
// for every in-range pair, PARTIAL otherwise (token_blocks.py: classify_token_blocks; types.py: block_type). With
// covers_groups the window cuts group pairs too: no pair outside it is allowed, and FULL needs every pair inside it.
__device__ int8_t classify(const BlockSummary& q, const BlockSummary& k, const Blocks& g, int qb, int kb, int window,
                           bool covers_groups) {
  const bool docs_overlap = q.doc_least <= k.doc_greatest && k.doc_least <= q.doc_greatest;
  const bool groups_overlap = q.grp_least <= k.grp_greatest && k.grp_least <= q.grp_greatest;
  const bool one_doc = q.doc_key == k.doc_key;
  const bool one_group = q.grp_key == k.grp_key;
  const bool all_before = g.k_last(kb) <= g.q_first(qb);
  const bool all_after = g.k_first(kb) > g.q_last(qb);
  const bool window_holds = window <= 0 || g.q_last(qb) - g.k_first(kb) < window;
  const bool window_fails = window > 0 && g.q_first(qb) - g.k_last(kb) >= window;
  if (!docs_overlap || ((all_after || window_fails) && !groups_overlap) || (covers_groups && window_fails))
    return OMNI_MASKED;
  if (one_doc && ((all_before && window_holds) || one_group) && (window_holds || !covers_groups)) return OMNI_FULL;
  if (one_doc && window_holds && !groups_overlap) return OMNI_CAUSAL;
  return OMNI_PARTIAL;
}

// A Q block's warp writes its row of the row view, a KV block's warp its row of the column view. Active
// columns go first, ascending (a stable compaction by ballot).
__global__ void write_lists(const int32_t* __restrict__ workspace, Blocks g, int batch, int window, bool covers_groups,
                            OmniBlockListOut kv, OmniBlockListOut q) {
  const WarpItem item = warp_item(g, batch);
  if (!item.active) return;
  const int b = item.b, lane = item.lane, row = item.index;
  const bool row_view = item.is_q;
  const int cols = row_view ? g.num_kv : g.num_q;
  // Field by field: selecting between two kernel parameters as a whole copies them to the stack.
  const OmniBlockListOut out{row_view ? kv.num_blocks : q.num_blocks, row_view ? kv.indices : q.indices,
                             row_view ? kv.types : q.types, row_view ? kv.partial : q.partial};
  const int64_t list = (static_cast<int64_t>(b) * (row_view ? g.num_q : g.num_kv) + row) * cols;
  const int64_t base = static_cast<int64_t>(b) * (g.num_q + g.num_kv);  // this batch row's first summary
  const BlockSummary mine = load_summary(workspace, item.warp);
  int count = 0;
  int8_t first_type = OMNI_MASKED;
  for (int start = 0; start < cols; start += kWarp) {
    const int col = start + lane;
    int8_t type = OMNI_MASKED;
    if (col < cols) {
      const BlockSummary other = load_summary(workspace, base + (row_view ? g.num_q + col : col));
      type = row_view ? classify(mine, other, g, row, col, window, covers_groups)
                      : classify(other, mine, g, col, row, window, covers_groups);
    }
    if (start == 0) first_type = __shfl_sync(kAllLanes, type, 0);
    const unsigned active = __ballot_sync(kAllLanes, type != OMNI_MASKED);
    if (type != OMNI_MASKED) {
      const int slot = count + __popc(active & ((1u << lane) - 1u));
      out.indices[list + slot] = col;
      out.types[list + slot] = type;
    }
    count += __popc(active);
  }
  for (int slot = count + lane; slot < cols; slot += kWarp) {
    out.indices[list + slot] = 0;
    out.types[list + slot] = first_type;
  }
  for (int slot = lane; slot < cols; slot += kWarp) out.partial[list + slot] = -1;
  if (lane == 0) out.num_blocks[static_cast<int64_t>(b) * (row_view ? g.num_q : g.num_kv) + row] = count;
}

// 3. The token ranges (omni_hf/mask/token_ranges.py, int for int), one CTA per chunk of OMNI_TOKEN_RANGE_CHUNK
//    positions of a batch row, in two launches: summarise_chunks reduces each chunk to what the others need of it
//    (RangeChunk); write_ranges combines the summaries of its row's other chunks with scans of its own.
constexpr int kRangeThreads = 256;
constexpr int kRangeItems = OMNI_TOKEN_RANGE_CHUNK / kRangeThreads;  // consecutive positions per thread
static_assert(kRangeThreads * kRangeItems == OMNI_TOKEN_RANGE_CHUNK, "a chunk is whole threads' items");

// A chunk's summary. Per position: where its document / group run ends and, where a counted run (id >= 0) starts,
// that id; where its runs start. "Counted run ids increase" is the condition for ranges (token_ranges.py).
struct RangeChunk {
  int4 ends_min;   // least (document end, group end, counted document start id, counted group start id)
  int2 starts_max;  // greatest (document start, group start)
  int2 ids_max;     // greatest (counted document start id, counted group start id)
  int bad;          // counted run ids do not increase inside the chunk
  int pad[3];
};
static_assert(sizeof(RangeChunk) == OMNI_TOKEN_RANGE_SUMMARY_INTS * sizeof(int), "summary size");

struct Int4Min {
  __device__ int4 operator()(int4 a, int4 b) const {
    return make_int4(min(a.x, b.x), min(a.y, b.y), min(a.z, b.z), min(a.w, b.w));
  }
};

struct Int2Max {
  __device__ int2 operator()(int2 a, int2 b) const { return make_int2(max(a.x, b.x), max(a.y, b.y)); }
};

__device__ constexpr int4 kNoEnds = {INT_MAX, INT_MAX, INT_MAX, INT_MAX};
__device__ constexpr int2 kNoIds = {INT_MIN, INT_MIN};
__device__ constexpr int2 kNoStarts = {0, 0};  // position 0 starts every run: no position's first start is below

// One chunk of one batch row in shared memory: the token rule's ids (document; group on real tokens, -1 on
// padding) of the chunk's positions and of one neighbour on each side, and what each position shows.
struct ChunkIds {
  int2 ids[OMNI_TOKEN_RANGE_CHUNK + 2];
  int chunk0, kv_len;

  __device__ void stage(const int32_t* doc, const int32_t* grp, int chunk, int length) {
    const int first = chunk * OMNI_TOKEN_RANGE_CHUNK;
    if (threadIdx.x == 0) {
      chunk0 = first;
      kv_len = length;
    }
    for (int i = threadIdx.x; i < OMNI_TOKEN_RANGE_CHUNK + 2; i += kRangeThreads) {
      const int p = first - 1 + i;
      const int d = p >= 0 && p < length ? doc[p] : -1;
      ids[i] = make_int2(d, p >= 0 && p < length && d >= 0 ? grp[p] : -1);
    }
    __syncthreads();
  }
  __device__ int2 at(int p) const { return ids[p - chunk0 + 1]; }
  // Whether a document run and a group run start at p (a group never continues into the next document).
  __device__ bool doc_starts(int p) const { return p == 0 || at(p - 1).x != at(p).x; }
  __device__ bool grp_starts(int p) const { return doc_starts(p) || at(p - 1).y != at(p).y; }
  // (document end, group end, counted document start id, counted group start id) at p, kNoEnds where none.
  __device__ int4 ends(int p) const {
    if (p >= kv_len) return kNoEnds;
    const bool last = p == kv_len - 1;
    const int2 id = at(p);
    return make_int4(last || doc_starts(p + 1) ? p : INT_MAX, last || grp_starts(p + 1) ? p : INT_MAX,
                     doc_starts(p) && id.x >= 0 ? id.x : INT_MAX, grp_starts(p) && id.y >= 0 ? id.y : INT_MAX);
  }
  __device__ int2 starts(int p) const {
    return p < kv_len ? make_int2(doc_starts(p) ? p : 0, grp_starts(p) ? p : 0) : kNoStarts;
  }
};

// The counted start ids of a position's ends(), kNoIds where none: the form a max-scan takes.
__device__ int2 counted_ids(int4 ends) {
  return make_int2(ends.z == INT_MAX ? INT_MIN : ends.z, ends.w == INT_MAX ? INT_MIN : ends.w);
}

using RangeScanMin = cub::BlockScan<int4, kRangeThreads>;
using RangeScanMax = cub::BlockScan<int2, kRangeThreads>;
using RangeReduceMin = cub::BlockReduce<int4, kRangeThreads>;
using RangeReduceMax = cub::BlockReduce<int2, kRangeThreads>;
union RangeTemp {
  typename RangeScanMin::TempStorage scan_min;
  typename RangeScanMax::TempStorage scan_max;
  typename RangeReduceMin::TempStorage reduce_min;
  typename RangeReduceMax::TempStorage reduce_max;
};

// Grid (chunks, batch): chunk blockIdx.x of row blockIdx.y -> summaries[blockIdx.y * gridDim.x + blockIdx.x].
__global__ void __launch_bounds__(kRangeThreads)
    summarise_chunks(const int32_t* __restrict__ doc_ids, const int32_t* __restrict__ group_ids, int kv_len,
                     RangeChunk* __restrict__ summaries) {
  __shared__ ChunkIds chunk;
  __shared__ RangeTemp temp;
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kv_len;
  chunk.stage(doc_ids + row, group_ids + row, blockIdx.x, kv_len);
  const int p0 = chunk.chunk0 + threadIdx.x * kRangeItems;
  int4 ends = kNoEnds;
  int2 starts = kNoStarts, ids = kNoIds, own_ids[kRangeItems];
  for (int i = 0; i < kRangeItems; ++i) {
    const int4 own = chunk.ends(p0 + i);
    own_ids[i] = counted_ids(own);
    ends = Int4Min()(ends, own);
    starts = Int2Max()(starts, chunk.starts(p0 + i));
    ids = Int2Max()(ids, own_ids[i]);
  }
  int2 before;  // greatest counted start ids of the threads before this one
  RangeScanMax(temp.scan_max).ExclusiveScan(ids, before, kNoIds, Int2Max());
  bool bad = false;
  for (int i = 0; i < kRangeItems; ++i) {
    const int2 id = own_ids[i];
    bad |= (id.x != INT_MIN && id.x <= before.x) || (id.y != INT_MIN && id.y <= before.y);
    before = Int2Max()(before, id);
  }
  bad = __syncthreads_or(bad);
  const int4 ends_min = RangeReduceMin(temp.reduce_min).Reduce(ends, Int4Min());
  __syncthreads();
  const int2 starts_max = RangeReduceMax(temp.reduce_max).Reduce(starts, Int2Max());
  __syncthreads();
  const int2 ids_max = RangeReduceMax(temp.reduce_max).Reduce(ids, Int2Max());
  if (threadIdx.x == 0) {
    summaries[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = {ends_min, starts_max, ids_max, bad, {}};
  }
}

// Grid (chunks, batch), as summarise_chunks. The row's chunks give this one its carries (ends of the chunks after
// it, starts of those before) and say whether the row's counted run ids increase; then a suffix scan of the ends
// (threads take the chunk backwards) and a prefix scan of the starts give each position its runs.
__global__ void __launch_bounds__(kRangeThreads)
    write_ranges(const int32_t* __restrict__ doc_ids, const int32_t* __restrict__ group_ids, int kv_len, int window,
                 bool covers_groups, const RangeChunk* __restrict__ summaries, int4* __restrict__ token_ranges) {
  __shared__ ChunkIds chunk;
  __shared__ RangeTemp temp;
  __shared__ int2 lasts[OMNI_TOKEN_RANGE_CHUNK];  // last position of each position's document / group run
  const int64_t row = static_cast<int64_t>(blockIdx.y) * kv_len;
  const RangeChunk* row_chunks = summaries + static_cast<int64_t>(blockIdx.y) * gridDim.x;
  const int me = blockIdx.x;

  // The other chunks, kRangeThreads at a time: the ids before chunk j must stay below its counted start ids.
  int4 after = kNoEnds;
  int2 before = kNoStarts, ids_before = kNoIds;
  bool bad = false;
  const int chunks = gridDim.x;
  for (int j0 = 0; j0 < chunks; j0 += kRangeThreads) {
    const int j = j0 + threadIdx.x;
    const RangeChunk c = j < chunks ? row_chunks[j] : RangeChunk{kNoEnds, kNoStarts, kNoIds, 0, {}};
    int2 ids_prefix, ids_total;
    RangeScanMax(temp.scan_max).ExclusiveScan(c.ids_max, ids_prefix, kNoIds, Int2Max(), ids_total);
    ids_prefix = Int2Max()(ids_before, ids_prefix);
    bad |= c.bad || (c.ends_min.z != INT_MAX && c.ends_min.z <= ids_prefix.x) ||
           (c.ends_min.w != INT_MAX && c.ends_min.w <= ids_prefix.y);
    ids_before = Int2Max()(ids_before, ids_total);
    __syncthreads();
    after = Int4Min()(after, RangeReduceMin(temp.reduce_min).Reduce(j > me ? c.ends_min : kNoEnds, Int4Min()));
    __syncthreads();
    const int2 starts_before = j < me ? c.starts_max : kNoStarts;
    before = Int2Max()(before, RangeReduceMax(temp.reduce_max).Reduce(starts_before, Int2Max()));
    __syncthreads();
  }
  bad = __syncthreads_or(bad);
  // Reduce's result is thread 0's only.
  __shared__ int4 shared_after;
  __shared__ int2 shared_before;
  if (threadIdx.x == 0) {
    shared_after = after;
    shared_before = before;
  }
  chunk.stage(doc_ids + row, group_ids + row, me, kv_len);  // its __syncthreads publishes the carries too
  after = shared_after;
  before = shared_before;

  // Suffix scan of the ends: thread t takes the chunk's positions backwards from its end, kRangeItems at a time.
  const int back0 = chunk.chunk0 + OMNI_TOKEN_RANGE_CHUNK - 1 - threadIdx.x * kRangeItems;
  int4 ends = kNoEnds, own_ends[kRangeItems];
  for (int i = 0; i < kRangeItems; ++i) {
    own_ends[i] = chunk.ends(back0 - i);
    ends = Int4Min()(ends, own_ends[i]);
  }
  int4 running;
  RangeScanMin(temp.scan_min).ExclusiveScan(ends, running, kNoEnds, Int4Min());
  running = Int4Min()(after, running);
  for (int i = 0; i < kRangeItems; ++i) {
    running = Int4Min()(running, own_ends[i]);
    lasts[back0 - i - chunk.chunk0] = make_int2(running.x, running.y);
  }
  __syncthreads();

  // Prefix scan of the starts, and the ranges.
  const int p0 = chunk.chunk0 + threadIdx.x * kRangeItems;
  int2 starts = kNoStarts, own_starts[kRangeItems];
  for (int i = 0; i < kRangeItems; ++i) {
    own_starts[i] = chunk.starts(p0 + i);
    starts = Int2Max()(starts, own_starts[i]);
  }
  int2 first;
  RangeScanMax(temp.scan_max).ExclusiveScan(starts, first, kNoStarts, Int2Max());
  first = Int2Max()(before, first);
  const int reach = window > 0 ? min(window - 1, kv_len) : kv_len;
  int4* out = token_ranges + row;
  for (int i = 0; i < kRangeItems; ++i) {
    const int p = p0 + i;
    first = Int2Max()(first, own_starts[i]);
    if (p >= kv_len) break;
    const int2 id = chunk.at(p), last = lasts[p - chunk.chunk0];
    const int grp_first = id.y >= 0 ? first.y : p, grp_last = id.y >= 0 ? last.y : p;
    int causal_first = max(first.x, p - reach), causal_last = min(last.x, p + reach);
    if (!covers_groups) {  // a group is seen whole (without a window the causal part covers it anyway)
      causal_first = min(causal_first, grp_first);
      causal_last = max(causal_last, grp_last);
    }
    int4 range = make_int4(causal_first, max(p, grp_last), min(p, grp_first), causal_last);
    if (id.x < 0) range = make_int4(0, -1, 0, -1);  // padding: empty ranges
    out[p] = bad ? make_int4(INT_MIN, INT_MIN, INT_MIN, INT_MIN) : range;
  }
}

int check_token_mask_params(const OmniTokenMaskParams& p) {
  if (!supported_block_size(p.block_q))
    return fail(OMNI_ERR_BLOCK_SIZE, "block_q=%d; expected " OMNI_BLOCK_SIZES_TEXT, p.block_q);
  if (!supported_block_size(p.block_kv))
    return fail(OMNI_ERR_BLOCK_SIZE, "block_kv=%d; expected " OMNI_BLOCK_SIZES_TEXT, p.block_kv);
  if (p.batch < 0 || p.kv_len < 1 || p.q_len < 1 || p.q_len > p.kv_len)
    return fail(OMNI_ERR_SHAPE, "batch=%d, q_len=%d, kv_len=%d; expected batch >= 0 and 1 <= q_len <= kv_len", p.batch,
                p.q_len, p.kv_len);
  const void* required[] = {p.doc_ids,    p.group_ids,    p.workspace, p.kv.num_blocks, p.kv.indices, p.kv.types,
                            p.kv.partial, p.q.num_blocks, p.q.indices, p.q.types,       p.q.partial};
  for (const void* ptr : required)
    if (ptr == nullptr) return fail(OMNI_ERR_SHAPE, "a pointer of OmniTokenMaskParams is NULL");
  return OMNI_OK;
}

}  // namespace
}  // namespace omni

extern "C" int omni_build_token_mask(const OmniTokenMaskParams* params) {
  using namespace omni;
  clear_error();
  if (params == nullptr) return fail(OMNI_ERR_SHAPE, "params is NULL");
  const OmniTokenMaskParams& p = *params;
  if (int s = check_token_mask_params(p)) return s;
  const Blocks g{p.q_len,
                 p.kv_len,
                 p.block_q,
                 p.block_kv,
                 (p.q_len + p.block_q - 1) / p.block_q,
                 (p.kv_len + p.block_kv - 1) / p.block_kv};
  const int warps = p.batch * (g.num_q + g.num_kv);
  if (warps == 0) return OMNI_OK;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int ctas = (warps + kWarpsPerCta - 1) / kWarpsPerCta;
  summarise_blocks<<<ctas, kWarpsPerCta * kWarp, 0, stream>>>(p.doc_ids, p.group_ids, g, p.batch, p.workspace);
  if (int s = check_cuda(cudaGetLastError(), "summarise_blocks launch")) return s;
  const bool covers_groups = p.window_covers_groups != 0;
  write_lists<<<ctas, kWarpsPerCta * kWarp, 0, stream>>>(p.workspace, g, p.batch, p.window, covers_groups, p.kv, p.q);
  if (int s = check_cuda(cudaGetLastError(), "write_lists launch")) return s;
  if (p.token_ranges == nullptr) return OMNI_OK;
  const dim3 chunks((p.kv_len + OMNI_TOKEN_RANGE_CHUNK - 1) / OMNI_TOKEN_RANGE_CHUNK, p.batch);
  const int64_t block_ints = (int64_t(OMNI_TOKEN_SUMMARY_INTS) * warps + 3) / 4 * 4;  // 16-byte aligned after
  auto* summaries = reinterpret_cast<RangeChunk*>(p.workspace + block_ints);
  summarise_chunks<<<chunks, kRangeThreads, 0, stream>>>(p.doc_ids, p.group_ids, p.kv_len, summaries);
  if (int s = check_cuda(cudaGetLastError(), "summarise_chunks launch")) return s;
  write_ranges<<<chunks, kRangeThreads, 0, stream>>>(p.doc_ids, p.group_ids, p.kv_len, p.window, covers_groups,
                                                     summaries, reinterpret_cast<int4*>(p.token_ranges));
  return check_cuda(cudaGetLastError(), "write_ranges launch");
}
