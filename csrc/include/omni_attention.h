// omni_hf CUDA library: the plain C ABI of its entry points (host/fwd_api.cu, bwd_api.cu, mask_build/).
//
// No torch types. The torch ops (host/torch_ops.cpp, registered through torch's stable C ABI) fill these structs
// from their tensors, pass pointers, strides and torch's current CUDA stream, and turn every non-zero return code
// into a RuntimeError (omni_error_string + omni_last_error_detail). Bump OMNI_ABI_VERSION whenever a struct below
// changes; the Python loader reads omni_abi_version when it loads the library and refuses another version.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define OMNI_ABI_VERSION 9

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { OMNI_FP16 = 0, OMNI_BF16 = 1, OMNI_FP32 = 2 } OmniDType;  // q, k, v: fp16 or bf16; a bias: any

// Must match omni_hf.mask.BlockType.
typedef enum { OMNI_MASKED = 0, OMNI_FULL = 1, OMNI_CAUSAL = 2, OMNI_PARTIAL = 3 } OmniBlockType;

// How a mask is given; must match omni_hf.mask.MaskKind. Masks that sizes describe need no block lists: the
// kernels derive each block's type from the block's positions (common/mask_rule.cuh, implicit_*).
typedef enum {
  OMNI_MASK_BLOCKS = 0,  // the block lists below (and the pool / token ids they refer to)
  OMNI_MASK_CAUSAL = 1,  // bottom-right causal, with the sliding window `window` when > 0; no lists
  OMNI_MASK_FULL = 2,    // every key (bidirectional, no padding); no lists
} OmniMaskKind;

typedef enum {
  OMNI_OK = 0,
  OMNI_ERR_DTYPE = 1,       // dtype not fp16 / bf16
  OMNI_ERR_HEAD_DIM = 2,    // head_dim is not a multiple of 8 up to the largest instantiated head dim
  OMNI_ERR_BLOCK_SIZE = 3,  // block_q / block_kv not supported by the kernel
  OMNI_ERR_ALIGNMENT = 4,   // a pointer or stride not 16-byte aligned / last dim not contiguous
  OMNI_ERR_SHAPE = 5,       // inconsistent sizes (heads_q % heads_kv, mask heads, lengths)
  OMNI_ERR_ARCH = 6,        // no kernel image for this GPU
  OMNI_ERR_CUDA = 7,        // a CUDA call or launch failed (detail has cudaGetErrorString)
  OMNI_ERR_WORKSPACE = 8,   // workspace missing or too small
} OmniStatus;

// A [B, H, S, D] tensor whose last dim is contiguous; strides in elements. stride_b / stride_h may be
// anything (Transformers hands a transposed BSHD view).
typedef struct {
  void* ptr;
  int64_t stride_b, stride_h, stride_s;
} OmniTensor;

// One view of the block lists (row view: per Q block its KV blocks; column view: per KV block its
// Q blocks). All four arrays are contiguous int tensors with leading dims [B|1, H|1]:
//   num_blocks [B, H, num_rows]             int32
//   indices    [B, H, num_rows, max_blocks] int32, ascending, entries >= num_blocks[...] ignored
//   types      [B, H, num_rows, max_blocks] int8 (OmniBlockType, never OMNI_MASKED in the active part)
//   partial    [B, H, num_rows, max_blocks] int32, pool index or -1 (PARTIAL by the token rule)
// stride_b / stride_h are in elements of num_blocks (0 when that dim broadcasts); the three list
// arrays use stride_b * max_blocks and stride_h * max_blocks.
typedef struct {
  const int32_t* num_blocks;
  const int32_t* indices;
  const int8_t* types;
  const int32_t* partial;
  int64_t stride_b, stride_h;
  int32_t num_rows, max_blocks;
} OmniBlockList;

// The mask. Element rule for batch b, query head h, query row i < q_len, key j < kv_len, with
// qpos = i + (kv_len - q_len) (bottom-right alignment), qb = i / block_q, kb = j / block_kv:
//   kb not among the active entries of row qb -> not allowed
//   FULL    -> allowed
//   CAUSAL  -> allowed iff qpos >= j
//   PARTIAL, p = partial >= 0 -> bit (jj % 32) of partial_pool[p][i % block_q][jj / 32], jj = j % block_kv
//   PARTIAL, p == -1 (token rule, doc = doc_ids[b], grp = group_ids[b], in_window = window <= 0 || qpos - j < window)
//       -> allowed iff doc[qpos] >= 0 && doc[qpos] == doc[j] &&
//       ((j <= qpos && in_window) || (grp[qpos] >= 0 && grp[qpos] == grp[j]))
//     or, with window_covers_groups (the window cuts group pairs too, as Transformers' Gemma 3 / 4 sliding layers):
//       doc[qpos] >= 0 && doc[qpos] == doc[j] && in_window && (j <= qpos || (grp[qpos] >= 0 && grp[qpos] == grp[j]))
// (with doc_ids / group_ids NULL: doc = 0 and grp = -1 at every position). Implicit kinds: OMNI_MASK_CAUSAL
// allows j <= qpos && (window <= 0 || qpos - j < window); OMNI_MASK_FULL allows every key.
// Rows past q_len and columns past kv_len are never allowed. A row with no allowed key gives out = 0,
// lse = -inf (with sinks: lse = sinks[h]), and zero gradients.
typedef struct {
  int32_t kind;                   // OmniMaskKind; the lists, pool and ids are read for OMNI_MASK_BLOCKS only
  OmniBlockList kv;               // row view (forward, dQ)
  OmniBlockList q;                // column view (dK, dV)
  const int32_t* partial_pool;    // [P, block_q, block_kv / 32] int32, bit j of word w = key w*32+j
  int32_t num_partial;            // P
  const int32_t* doc_ids;         // [B|1, kv_len] int32, or NULL when no block uses the token rule
  const int32_t* group_ids;       // [B|1, kv_len] int32, or NULL
  int64_t ids_stride_b;           // 0 when the ids broadcast over the batch
  // The token rule of each position as ranges, or NULL (the kernels then compare ids): [B|1, kv_len, 4] int32,
  // batch stride 4 * ids_stride_b, (first, last) allowed key of the position as a query and (first, last) allowed
  // query position of it as a key (omni_hf/mask/token_ranges.py); INT32_MIN at every position of a batch row whose ids
  // do not allow ranges. Used only where doc_ids is given.
  const int32_t* token_ranges;
  int32_t window;  // sliding window of the causal part (token rule, OMNI_MASK_CAUSAL); <= 0: none
  int32_t window_covers_groups;  // token rule: non-zero where the window cuts group pairs too (see above)
  int32_t block_q, block_kv;  // 64 or 128 each
  int32_t heads;  // 1 or heads_q (the H of the lists above); 1 for implicit kinds
} OmniMask;

// An additive score bias, or ptr NULL: the logit of query row i (< q_len) and key j (< kv_len) of batch b, query
// head h is (capped) scale * q.k + the element at ptr + b * stride_b + h * stride_h + i * stride_q + j * stride_k
// (elements of dtype; stride 0 broadcasts a dim). Read only for pairs of tiles the mask allows. Not with softcap.
typedef struct {
  const void* ptr;
  int32_t dtype;  // OmniDType: fp32, fp16 or bf16
  // Non-zero where two neighbouring keys can be read as one vector: stride_k 1, every other stride even and ptr
  // aligned to two elements.
  int32_t paired;
  int64_t stride_b, stride_h, stride_q, stride_k;
} OmniBias;

// The bias's gradient, or ptr NULL: dL/dlogit of every allowed pair goes to the element at ptr + b * stride_b +
// h * stride_h + i * stride_q + j * stride_k. Where no two pairs share an element (exclusive: no stride is 0 on a
// dim of the call longer than 1) it is stored, in dtype; otherwise it is added to float32 elements with atomics,
// so a stride-0 dim sums over it (a bias broadcast over the batch gets the batch's sum). The caller zeroes it
// first; pairs never allowed stay 0.
typedef struct {
  void* ptr;
  int32_t dtype;  // OmniDType: fp32, fp16 or bf16 where exclusive, else fp32
  int32_t exclusive;
  int64_t stride_b, stride_h, stride_q, stride_k;
} OmniBiasGrad;

typedef struct {
  int32_t dtype;  // OmniDType, of q, k, v, out (and dout, dq, dk, dv): fp16 or bf16
  // head_dim: D, a multiple of 8 up to the largest instantiated head dim; the kernels of the smallest instantiated
  // one at or above it run the call, reading the columns past D as zeros and writing only the first D
  int32_t batch, heads_q, heads_kv, q_len, kv_len, head_dim;
  float scale;  // applied to q.k before softcap
  float softcap;  // <= 0: none; else s = softcap * tanh(s / softcap)
  // Per-query-head sink logits [heads_q] fp32 contiguous (natural log, on the scale of the scaled and capped
  // scores), or NULL: exp(sinks[h]) joins every row's softmax denominator and takes no value, so
  // lse = log(exp(sinks[h]) + sum_j exp(s_j)) and out = sum_j exp(s_j - lse) v_j. The backward's P = exp(s - lse)
  // already holds the sink; its preprocess reads the sinks only for their gradient (OmniBwdParams::dsinks).
  const float* sinks;
  OmniBias bias;  // read by the forward and (to recompute P) the backward
  OmniTensor q, k, v;  // q [B, Hq, q_len, D]; k, v [B, Hkv, kv_len, D]; Hq % Hkv == 0
  OmniTensor out;  // [B, Hq, q_len, D], written by the forward
  float* lse;  // [B, Hq, q_len] fp32 contiguous, natural log; -inf for empty rows
  OmniMask mask;
  void* stream;  // cudaStream_t
  void* workspace;  // device memory of omni_fwd_workspace_bytes() (NULL when it is 0); no init
  size_t workspace_bytes;
} OmniFwdParams;

typedef struct {
  OmniFwdParams fwd;  // the forward's inputs, its out and its lse (read only here)
  OmniTensor dout;  // [B, Hq, q_len, D]
  OmniTensor dq;  // [B, Hq, q_len, D]
  OmniTensor dk, dv;  // [B, Hkv, kv_len, D] (summed over the query heads of each group)
  OmniBiasGrad dbias;  // where fwd.bias is given and its gradient wanted, else ptr NULL
  // The sinks' gradient [heads_q] fp32 (zeroed by the caller), or NULL: the backward adds
  // dsinks[h] = -sum over the batch and rows of exp(sinks[h] - lse) * rowsum(dout * out); needs fwd.sinks.
  float* dsinks;
  // Non-zero: gradients bitwise equal on every run. The kernels that add into one dQ tile then take turns in
  // ascending key order, and with block lists read fwd.mask.kv (the row view) as well as fwd.mask.q; dsinks must be
  // NULL and dbias, where given, exclusive (what would be added with atomics is the caller's to sum). Both kernel
  // families (sm_90a, sm_80) have this variant.
  int32_t deterministic;
  void* workspace;  // device memory of omni_bwd_workspace_bytes(); contents need no init
  size_t workspace_bytes;
} OmniBwdParams;

// Token-rule block lists built on the device: what omni_hf.mask.OmniBlockMask.from_token_ids computes
// with PyTorch ops (same classification, same list layout, byte for byte). Outputs of one view, with
// rows / cols = nQ / nK (row view) or nK / nQ (column view), all contiguous:
//   num_blocks [B, rows] int32; indices [B, rows, cols] int32; types [B, rows, cols] int8; partial
//   [B, rows, cols] int32 (all -1). Entries past num_blocks hold index 0 and the type of column 0.
typedef struct {
  int32_t* num_blocks;
  int32_t* indices;
  int8_t* types;
  int32_t* partial;
} OmniBlockListOut;

typedef struct {
  const int32_t* doc_ids;  // [B, kv_len] int32 contiguous, -1 = padding
  const int32_t* group_ids;  // [B, kv_len] int32 contiguous, -1 = causal text
  int32_t batch, q_len, kv_len;  // q_len <= kv_len: the queries are the last q_len positions
  int32_t block_q, block_kv;  // 64 or 128 each
  int32_t window;  // <= 0: none
  int32_t window_covers_groups;  // non-zero: the window cuts group pairs too (OmniMask::window_covers_groups)
  OmniBlockListOut kv;  // row view: per Q block its KV blocks
  OmniBlockListOut q;  // column view: per KV block its Q blocks
  int32_t* token_ranges;  // [B, kv_len, 4] int32 out (OmniMask::token_ranges), or NULL: not built
  int32_t* workspace;  // int32 of the size given below, contents need no init
  void* stream;  // cudaStream_t
} OmniTokenMaskParams;

#define OMNI_TOKEN_SUMMARY_INTS 6  // per block: least id >= 0, greatest id, key; for docs, then groups
#define OMNI_TOKEN_RANGE_CHUNK 2048  // positions per CTA of the token ranges' scans
#define OMNI_TOKEN_RANGE_SUMMARY_INTS 12  // per chunk of a row: what the other chunks need of it
// Workspace of omni_build_token_mask: OMNI_TOKEN_SUMMARY_INTS * B * (nQ + nK) ints for the blocks, rounded up to a
// multiple of 4, then (where token_ranges is asked for) OMNI_TOKEN_RANGE_SUMMARY_INTS * B * ceil(kv_len /
// OMNI_TOKEN_RANGE_CHUNK) for the chunks; 16-byte aligned.

int omni_abi_version(void);
size_t omni_fwd_workspace_bytes(const OmniFwdParams* params);  // 0 unless it splits keys or runs persistent
int omni_fwd(const OmniFwdParams* params);
size_t omni_bwd_workspace_bytes(const OmniBwdParams* params);
int omni_bwd(const OmniBwdParams* params);
int omni_build_token_mask(const OmniTokenMaskParams* params);
const char* omni_error_string(int status);
const char* omni_last_error_detail(void);  // thread-local text of the last failure, "" if none

#ifdef __cplusplus
}
#endif
