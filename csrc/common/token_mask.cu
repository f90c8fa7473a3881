// omni_build_token_mask: the token-rule block lists of omni_hf.mask.OmniBlockMask.from_token_ids in two
// launches instead of ~80 small PyTorch ops (the build is launch-bound on a GPU).
//
//   1. summarise_blocks: one warp per Q block and per KV block reduces its ids to six ints (least id >= 0,
//      greatest id, key; for documents, then groups), as _TokenSummary does.
//   2. write_lists: one warp per row of each view classifies its (Q block, KV block) pairs from the
//      summaries, as _classify_token_blocks does, and compacts the active ones with a ballot.
#include <climits>

#include "common/status.cuh"

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
  return {warp, static_cast<int>(threadIdx.x % kWarp), warp / per_row, is_q, is_q ? block : block - g.num_q,
          warp < batch * per_row};
}

// Summaries of Q blocks cover the last q_len positions. Group ids count only where doc >= 0.
__global__ void summarise_blocks(const int32_t* __restrict__ doc_ids, const int32_t* __restrict__ group_ids,
                                 Blocks g, int batch, int32_t* __restrict__ workspace) {
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
// for every in-range pair, PARTIAL otherwise (mask.py: _classify_token_blocks and _block_type).
__device__ int8_t classify(const BlockSummary& q, const BlockSummary& k, const Blocks& g, int qb, int kb,
                           int window) {
  const bool docs_overlap = q.doc_least <= k.doc_greatest && k.doc_least <= q.doc_greatest;
  const bool groups_overlap = q.grp_least <= k.grp_greatest && k.grp_least <= q.grp_greatest;
  const bool one_doc = q.doc_key == k.doc_key;
  const bool one_group = q.grp_key == k.grp_key;
  const bool all_before = g.k_last(kb) <= g.q_first(qb);
  const bool all_after = g.k_first(kb) > g.q_last(qb);
  const bool window_holds = window <= 0 || g.q_last(qb) - g.k_first(kb) < window;
  const bool window_fails = window > 0 && g.q_first(qb) - g.k_last(kb) >= window;
  if (!docs_overlap || ((all_after || window_fails) && !groups_overlap)) return OMNI_MASKED;
  if (one_doc && ((all_before && window_holds) || one_group)) return OMNI_FULL;
  if (one_doc && window_holds && !groups_overlap) return OMNI_CAUSAL;
  return OMNI_PARTIAL;
}

// A Q block's warp writes its row of the row view, a KV block's warp its row of the column view. Active
// columns go first, ascending (a stable compaction by ballot).
__global__ void write_lists(const int32_t* __restrict__ workspace, Blocks g, int batch, int window,
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
      type = row_view ? classify(mine, other, g, row, col, window) : classify(other, mine, g, col, row, window);
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

int check_token_mask_params(const OmniTokenMaskParams& p) {
  if (p.block_q != 64 && p.block_q != 128) return fail(OMNI_ERR_BLOCK_SIZE, "block_q=%d; expected 64 or 128", p.block_q);
  if (p.block_kv != 64 && p.block_kv != 128)
    return fail(OMNI_ERR_BLOCK_SIZE, "block_kv=%d; expected 64 or 128", p.block_kv);
  if (p.batch < 0 || p.kv_len < 1 || p.q_len < 1 || p.q_len > p.kv_len)
    return fail(OMNI_ERR_SHAPE, "batch=%d, q_len=%d, kv_len=%d; expected batch >= 0 and 1 <= q_len <= kv_len",
                p.batch, p.q_len, p.kv_len);
  const void* required[] = {p.doc_ids, p.group_ids, p.workspace, p.kv.num_blocks, p.kv.indices, p.kv.types,
                            p.kv.partial, p.q.num_blocks, p.q.indices, p.q.types, p.q.partial};
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
  const Blocks g{p.q_len, p.kv_len, p.block_q, p.block_kv, (p.q_len + p.block_q - 1) / p.block_q,
                 (p.kv_len + p.block_kv - 1) / p.block_kv};
  const int warps = p.batch * (g.num_q + g.num_kv);
  if (warps == 0) return OMNI_OK;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int ctas = (warps + kWarpsPerCta - 1) / kWarpsPerCta;
  summarise_blocks<<<ctas, kWarpsPerCta * kWarp, 0, stream>>>(p.doc_ids, p.group_ids, g, p.batch, p.workspace);
  if (int s = check_cuda(cudaGetLastError(), "summarise_blocks launch")) return s;
  write_lists<<<ctas, kWarpsPerCta * kWarp, 0, stream>>>(p.workspace, g, p.batch, p.window, p.kv, p.q);
  return check_cuda(cudaGetLastError(), "write_lists launch");
}
