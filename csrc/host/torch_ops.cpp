// The omni_hf ops, registered with PyTorch through its stable C ABI, so that one binary serves every torch from
// the version it was built for onward (TORCH_TARGET_VERSION, set by omni_hf/build.py) and a call from Python is
// one dispatch: the op reads its tensors, allocates its outputs with torch's caching allocator (CUDA-graph safe),
// takes torch's current stream and calls the C entry points of include/omni_attention.h. Nothing here syncs.
//
//   omni_hf::fwd(q, k, v, <row view>, kind, block_q, block_kv, window, window_covers_groups, scale, softcap, sinks,
//       bias) -> (out, lse)
//   omni_hf::bwd(dout, q, k, v, out, lse, <column view>, kind, block_q, block_kv, window, window_covers_groups, scale,
//       softcap, bias, dbias, sinks, dsinks, deterministic) -> (dq, dk, dv), writing the bias's gradient into dbias
//       (zeroed by the caller; float32 where it broadcasts, as the kernels add into it) and adding the sinks' into
//       dsinks (float32, zeroed) where given; deterministic: bitwise-repeatable gradients (OmniBwdParams), which
//       for block lists also reads the row view (row_num_blocks, row_indices, row_types, row_partial)
//
// bias / dbias: [B, Hq, Sq, Skv] views of any strides (0 where a dim broadcasts), read and accumulated in place.
//   omni_hf::token_mask(doc_ids, group_ids, q_len, block_q, block_kv, window, window_covers_groups) -> the eight
//       lists of both views and the token ranges
//
// <row view> / <column view> = num_blocks, indices, types, partial, pool, doc_ids, group_ids, token_ranges: each
// optional (absent for the implicit mask kinds, which need no lists). The checks here cover what the kernels' reads
// rely on (one device, agreeing shapes, dtypes, lists and ids that broadcast over q) and raise RuntimeError;
// omni_hf/ops/attention.py checks the rest (the mask's lengths, the scalars) and, when an op refuses its inputs,
// names the argument at fault. q / k / v of any strides with the last dim contiguous, and any dout, are taken (what
// the kernels' 16-byte loads cannot read is copied first); outputs follow their input's layout (output_strides): a
// transposed [B, S, H, D] q gives out and dq in that layout, so Transformers' transpose back is free.
#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>

#include "omni_attention.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;
using OptTensor = std::optional<Tensor>;

bool g_poison_outputs = false;  // test hook (omni_set_poison_outputs): NaN-fill outputs before the kernels run

void check_status(int status, const char* entry) {
  STD_TORCH_CHECK(status == OMNI_OK, entry, " failed: ", omni_error_string(status), ": ", omni_last_error_detail());
}

using Dims = std::array<int64_t, 4>;

// An uninitialised tensor on `like`'s device; contiguous unless `strides` are given.
Tensor empty(std::initializer_list<int64_t> sizes, int32_t dtype, const Tensor& like, const Dims* strides = nullptr) {
  Dims shape{}, contiguous{};
  const int ndim = static_cast<int>(sizes.size());
  std::copy(sizes.begin(), sizes.end(), shape.begin());
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    contiguous[d] = stride;
    stride *= shape[d];
  }
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(ndim, shape.data(), strides ? strides->data() : contiguous.data(),
                                                  dtype, aoti_torch_device_type_cuda(), like.get_device_index(),
                                                  &handle));
  return Tensor(handle);
}

// Strides of the output of [B, H, S, D] input t: [B, S, H, D] order where t is that layout transposed, else
// contiguous. Mirrors omni_hf.ops.library.output_strides (the ops' fake implementations).
Dims output_strides(const Tensor& t) {
  const int64_t heads = t.size(1), seq = t.size(2), dim = t.size(3);
  if (t.stride(1) == dim && t.stride(2) == heads * dim && t.stride(3) == 1)
    return {seq * heads * dim, dim, heads * dim, 1};
  return {heads * seq * dim, seq * dim, dim, 1};
}

// An uninitialised tensor shaped like [B, H, S, D] t, in t's dtype and in the layout output_strides gives.
Tensor output_like(const Tensor& t) {
  const Dims strides = output_strides(t);
  return empty({t.size(0), t.size(1), t.size(2), t.size(3)},
               t.scalar_type() == ScalarType::BFloat16 ? aoti_torch_dtype_bfloat16() : aoti_torch_dtype_float16(), t,
               &strides);
}

// t itself when the kernels' 16-byte loads can read it (last dim contiguous, 16-byte aligned pointer and
// strides), else a copy they can.
Tensor readable(const Tensor& t) {
  auto aligned = [](int64_t stride, int64_t size) { return size == 1 || stride % 8 == 0; };
  if (t.dim() == 4 && t.stride(3) == 1 && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
      aligned(t.stride(0), t.size(0)) && aligned(t.stride(1), t.size(1)) && aligned(t.stride(2), t.size(2)))
    return t;
  return torch::stable::contiguous(torch::stable::clone(t));
}

void poison(const Tensor& t, cudaStream_t stream) {
  if (g_poison_outputs) cudaMemsetAsync(t.data_ptr(), 0xFF, t.numel() * t.element_size(), stream);  // NaN bits
}

cudaStream_t current_stream(const Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

int32_t element_dtype(const Tensor& t, const char* name) {
  const ScalarType type = t.scalar_type();
  STD_TORCH_CHECK(type == ScalarType::Half || type == ScalarType::BFloat16, name, ": expected float16 or bfloat16");
  return type == ScalarType::BFloat16 ? OMNI_BF16 : OMNI_FP16;
}

// A [B, H, S, D] tensor with the last dim contiguous; strides of size-1 dims are reported as 0 (never stepped).
OmniTensor view4(const Tensor& t, const char* name) {
  STD_TORCH_CHECK(t.dim() == 4 && t.is_cuda(), name, ": expected a 4-d CUDA tensor");
  STD_TORCH_CHECK(t.stride(3) == 1 || t.size(3) == 1, name, ": expected the last dim contiguous");
  auto stride = [&](int d) { return t.size(d) == 1 ? int64_t{0} : t.stride(d); };
  return {t.data_ptr(), stride(0), stride(1), stride(2)};
}

// The raw pointer of an optional contiguous tensor of `type` (nullptr when absent).
void* pointer(const OptTensor& t, ScalarType type, const char* name, int32_t device) {
  if (!t.has_value()) return nullptr;
  STD_TORCH_CHECK(t->scalar_type() == type && t->is_contiguous() && t->is_cuda() && t->get_device_index() == device,
                  name, ": expected a contiguous tensor of the list dtype on q's CUDA device");
  return t->data_ptr();
}

// The four strides of a [B, Hq, Sq, Skv] view of q's call (0 where a dim broadcasts), on q's device.
std::array<int64_t, 4> score_strides(const Tensor& t, const Tensor& q, const Tensor& k, const char* name) {
  STD_TORCH_CHECK(t.dim() == 4 && t.size(0) == q.size(0) && t.size(1) == q.size(1) && t.size(2) == q.size(2) &&
                      t.size(3) == k.size(2) && t.is_cuda() && t.get_device_index() == q.get_device_index(),
                  name, ": expected a [B, Hq, Sq, Skv] view on q's device");
  auto stride = [&](int d) { return t.size(d) == 1 ? int64_t{0} : t.stride(d); };
  return {stride(0), stride(1), stride(2), stride(3)};
}

int32_t score_dtype(const Tensor& t, const char* name) {
  const ScalarType type = t.scalar_type();
  STD_TORCH_CHECK(type == ScalarType::Float || type == ScalarType::Half || type == ScalarType::BFloat16, name,
                  ": expected float32, float16 or bfloat16");
  return type == ScalarType::Float ? OMNI_FP32 : type == ScalarType::Half ? OMNI_FP16 : OMNI_BF16;
}

OmniBias bias_of(const OptTensor& bias, const Tensor& q, const Tensor& k) {
  if (!bias.has_value()) return OmniBias{};
  const int32_t dtype = score_dtype(*bias, "bias");
  const auto s = score_strides(*bias, q, k, "bias");
  const int64_t pair_bytes = 2 * bias->element_size();
  const bool paired = s[3] == 1 && s[0] % 2 == 0 && s[1] % 2 == 0 && s[2] % 2 == 0 &&
                      reinterpret_cast<uintptr_t>(bias->data_ptr()) % pair_bytes == 0;
  return {bias->data_ptr(), dtype, paired ? 1 : 0, s[0], s[1], s[2], s[3]};
}

// The gradient's view: exclusive where no dim of the call longer than 1 has stride 0 (every pair its own element).
OmniBiasGrad bias_grad_of(const OptTensor& dbias, const Tensor& q, const Tensor& k) {
  if (!dbias.has_value()) return OmniBiasGrad{};
  const int32_t dtype = score_dtype(*dbias, "dbias");
  const auto s = score_strides(*dbias, q, k, "dbias");
  bool exclusive = true;
  for (int d = 0; d < 4; ++d) exclusive = exclusive && (dbias->size(d) == 1 || s[d] != 0);
  STD_TORCH_CHECK(exclusive || dtype == OMNI_FP32,
                  "dbias: expected float32 where it broadcasts (its elements are sums over the broadcast dims)");
  return {dbias->data_ptr(), dtype, exclusive ? 1 : 0, s[0], s[1], s[2], s[3]};
}

// q, k and v as the kernels read them: on one CUDA device, the last dim contiguous (any other stride is copied where
// the loads cannot read it: readable), k with q's batch and head dim, v shaped as k (their dtypes: element_dtype).
void check_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  STD_TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "q, k, v: expected 4-d tensors [B, H, S, D]");
  STD_TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
                  "q, k, v: expected the last dim contiguous");
  STD_TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && k.get_device_index() == q.get_device_index() &&
                      v.get_device_index() == q.get_device_index(),
                  "q, k, v: expected tensors on one CUDA device");
  STD_TORCH_CHECK(k.size(0) == q.size(0) && k.size(3) == q.size(3), "k: expected the batch and head dim of q");
  STD_TORCH_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2) && v.size(3) == k.size(3),
                  "v: expected the shape of k");
}

// The mask's lists broadcast over q's batch and heads (batch and heads 1 or q's), its ids over the batch with one id
// per key.
void check_mask_extent(const OptTensor& num, const OptTensor& doc, const OptTensor& grp, const Tensor& q,
                       const Tensor& k) {
  const int64_t batch = q.size(0), heads = q.size(1), kv_len = k.size(2);
  if (num.has_value()) {
    STD_TORCH_CHECK((num->size(0) == 1 || num->size(0) == batch) && (num->size(1) == 1 || num->size(1) == heads),
                    "block lists: expected batch 1 or ", batch, " and heads 1 or ", heads);
  }
  for (const OptTensor* ids : {&doc, &grp}) {
    if (!ids->has_value()) continue;
    STD_TORCH_CHECK(
        (*ids)->dim() == 2 && ((*ids)->size(0) == 1 || (*ids)->size(0) == batch) && (*ids)->size(1) == kv_len,
        "token ids: expected [1 or ", batch, ", kv_len=", kv_len, "]");
  }
  STD_TORCH_CHECK(!doc.has_value() || !grp.has_value() || doc->size(0) == grp->size(0),
                  "token ids: expected doc_ids and group_ids of one batch");
}

// One view of the block lists: num [B|1, H|1, rows], indices / types / partial [B|1, H|1, rows, maxBlocks].
OmniBlockList block_list(const OptTensor& num, const OptTensor& indices, const OptTensor& types,
                         const OptTensor& partial, int32_t device) {
  OmniBlockList list{};
  list.num_blocks = static_cast<const int32_t*>(pointer(num, ScalarType::Int, "num_blocks", device));
  list.indices = static_cast<const int32_t*>(pointer(indices, ScalarType::Int, "indices", device));
  list.types = static_cast<const int8_t*>(pointer(types, ScalarType::Char, "types", device));
  list.partial = static_cast<const int32_t*>(pointer(partial, ScalarType::Int, "partial", device));
  if (num.has_value() && indices.has_value()) {
    STD_TORCH_CHECK(num->dim() == 3 && indices->dim() == 4,
                    "block lists: expected num [B, H, rows] and lists "
                    "[B, H, rows, maxBlocks]");
    const int64_t batch = num->size(0), heads = num->size(1), rows = num->size(2);
    list.stride_b = batch == 1 ? 0 : heads * rows;
    list.stride_h = heads == 1 ? 0 : rows;
    list.num_rows = static_cast<int32_t>(rows);
    list.max_blocks = static_cast<int32_t>(indices->size(3));
  }
  return list;
}

// The mask of one call from the view's tensors and sizes (see the file comment).
OmniMask make_mask(const OptTensor& num, const OptTensor& indices, const OptTensor& types, const OptTensor& partial,
                   const OptTensor& pool, const OptTensor& doc, const OptTensor& grp, const OptTensor& ranges,
                   int64_t kind, int64_t block_q, int64_t block_kv, int64_t window, bool window_covers_groups,
                   bool row_view, int32_t device) {
  OmniMask m{};
  m.kind = static_cast<int32_t>(kind);
  (row_view ? m.kv : m.q) = block_list(num, indices, types, partial, device);
  m.partial_pool = static_cast<const int32_t*>(pointer(pool, ScalarType::Int, "partial_pool", device));
  m.num_partial = pool.has_value() ? static_cast<int32_t>(pool->size(0)) : 0;
  m.doc_ids = static_cast<const int32_t*>(pointer(doc, ScalarType::Int, "doc_ids", device));
  m.group_ids = static_cast<const int32_t*>(pointer(grp, ScalarType::Int, "group_ids", device));
  const OptTensor& ids = doc.has_value() ? doc : grp;
  m.ids_stride_b = ids.has_value() && ids->size(0) > 1 ? ids->stride(0) : 0;
  m.token_ranges = static_cast<const int32_t*>(pointer(ranges, ScalarType::Int, "token_ranges", device));
  if (ranges.has_value()) {
    STD_TORCH_CHECK(doc.has_value() && ranges->dim() == 3 && ranges->size(0) == doc->size(0) &&
                        ranges->size(1) == doc->size(1) && ranges->size(2) == 4,
                    "token_ranges: expected [B, kv_len, 4] beside doc_ids [B, kv_len]");
  }
  m.window = static_cast<int32_t>(window);
  m.window_covers_groups = window_covers_groups ? 1 : 0;
  m.block_q = static_cast<int32_t>(block_q);
  m.block_kv = static_cast<int32_t>(block_kv);
  m.heads = num.has_value() ? static_cast<int32_t>(num->size(1)) : 1;
  return m;
}

OmniFwdParams fwd_params(const Tensor& q, const Tensor& k, const Tensor& v, const OmniMask& mask, double scale,
                         double softcap, cudaStream_t stream) {
  OmniFwdParams p{};
  p.dtype = element_dtype(q, "q");
  STD_TORCH_CHECK(element_dtype(k, "k") == p.dtype && element_dtype(v, "v") == p.dtype, "k, v: expected q's dtype");
  p.batch = static_cast<int32_t>(q.size(0));
  p.heads_q = static_cast<int32_t>(q.size(1));
  p.q_len = static_cast<int32_t>(q.size(2));
  p.head_dim = static_cast<int32_t>(q.size(3));
  p.heads_kv = static_cast<int32_t>(k.size(1));
  p.kv_len = static_cast<int32_t>(k.size(2));
  p.scale = static_cast<float>(scale);
  p.softcap = static_cast<float>(softcap);
  p.q = view4(q, "q");
  p.k = view4(k, "k");
  p.v = view4(v, "v");
  p.mask = mask;
  p.stream = stream;
  return p;
}

std::tuple<Tensor, Tensor> fwd(Tensor q, Tensor k, Tensor v, OptTensor num, OptTensor indices, OptTensor types,
                               OptTensor partial, OptTensor pool, OptTensor doc, OptTensor grp, OptTensor ranges,
                               int64_t kind, int64_t block_q, int64_t block_kv, int64_t window,
                               bool window_covers_groups, double scale, double softcap, OptTensor sinks,
                               OptTensor bias) {
  check_qkv(q, k, v);
  STD_TORCH_CHECK(!sinks.has_value() || (sinks->dim() == 1 && sinks->size(0) == q.size(1) && sinks->is_contiguous()),
                  "sinks: expected a contiguous float32 [Hq] tensor");
  check_mask_extent(num, doc, grp, q, k);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const cudaStream_t stream = current_stream(q);
  Tensor out = output_like(q);
  const Tensor q_in = readable(q), k_in = readable(k), v_in = readable(v);  // alive until the launch
  const OmniMask mask = make_mask(num, indices, types, partial, pool, doc, grp, ranges, kind, block_q, block_kv, window,
                                  window_covers_groups, true, q.get_device_index());
  OmniFwdParams p = fwd_params(q_in, k_in, v_in, mask, scale, softcap, stream);
  p.sinks = static_cast<const float*>(pointer(sinks, ScalarType::Float, "sinks", q.get_device_index()));
  p.bias = bias_of(bias, q, k);
  Tensor lse = empty({q.size(0), q.size(1), q.size(2)}, aoti_torch_dtype_float32(), q);
  poison(out, stream);
  poison(lse, stream);
  p.out = view4(out, "out");
  p.lse = static_cast<float*>(lse.data_ptr());
  const size_t bytes = omni_fwd_workspace_bytes(&p);
  std::optional<Tensor> workspace;  // alive until the launch
  if (bytes > 0) {
    workspace = empty({static_cast<int64_t>(bytes)}, aoti_torch_dtype_uint8(), q);
    poison(*workspace, stream);
    p.workspace = workspace->data_ptr();
    p.workspace_bytes = bytes;
  }
  check_status(omni_fwd(&p), "omni_fwd");
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor> bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, OptTensor num,
                                       OptTensor indices, OptTensor types, OptTensor partial, OptTensor pool,
                                       OptTensor doc, OptTensor grp, OptTensor ranges, int64_t kind, int64_t block_q,
                                       int64_t block_kv, int64_t window, bool window_covers_groups, double scale,
                                       double softcap, OptTensor bias, OptTensor dbias, OptTensor sinks,
                                       OptTensor dsinks, bool deterministic, OptTensor row_num, OptTensor row_indices,
                                       OptTensor row_types, OptTensor row_partial) {
  check_qkv(q, k, v);
  check_mask_extent(num, doc, grp, q, k);
  for (const Tensor* t : {&dout, &out}) {
    STD_TORCH_CHECK(t->dim() == 4 && t->is_cuda() && t->get_device_index() == q.get_device_index() &&
                        t->size(0) == q.size(0) && t->size(1) == q.size(1) && t->size(2) == q.size(2) &&
                        t->size(3) == q.size(3),
                    "dout, out: expected the shape of q on its device");
  }
  STD_TORCH_CHECK(lse.dim() == 3 && lse.is_cuda() && lse.get_device_index() == q.get_device_index() &&
                      lse.scalar_type() == ScalarType::Float && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) &&
                      lse.size(2) == q.size(2),
                  "lse: expected float32 [B, Hq, Sq] of q on its device");
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const cudaStream_t stream = current_stream(q);
  Tensor dq = output_like(q), dk = output_like(k), dv = output_like(v);
  if (!lse.is_contiguous()) lse = torch::stable::contiguous(lse);
  const Tensor q_in = readable(q), k_in = readable(k), v_in = readable(v), out_in = readable(out),
               dout_in = readable(dout);  // alive until the launches
  OmniBwdParams p{};
  p.fwd = fwd_params(q_in, k_in, v_in,
                     make_mask(num, indices, types, partial, pool, doc, grp, ranges, kind, block_q, block_kv, window,
                               window_covers_groups, false, q.get_device_index()),
                     scale, softcap, stream);
  p.fwd.out = view4(out_in, "out");
  p.fwd.lse = static_cast<float*>(lse.data_ptr());
  p.fwd.bias = bias_of(bias, q, k);
  p.dbias = bias_grad_of(dbias, q, k);
  for (const OptTensor* t : {&sinks, &dsinks}) {
    STD_TORCH_CHECK(!t->has_value() || ((*t)->dim() == 1 && (*t)->size(0) == q.size(1)),
                    "sinks, dsinks: expected contiguous float32 [Hq] tensors");
  }
  p.fwd.sinks = static_cast<const float*>(pointer(sinks, ScalarType::Float, "sinks", q.get_device_index()));
  p.dsinks = static_cast<float*>(pointer(dsinks, ScalarType::Float, "dsinks", q.get_device_index()));
  p.deterministic = deterministic;
  if (row_num.has_value())
    p.fwd.mask.kv = block_list(row_num, row_indices, row_types, row_partial, q.get_device_index());
  for (const Tensor* grad : {&dq, &dk, &dv}) poison(*grad, stream);
  p.dout = view4(dout_in, "dout");
  p.dq = view4(dq, "dq");
  p.dk = view4(dk, "dk");
  p.dv = view4(dv, "dv");
  const size_t bytes = omni_bwd_workspace_bytes(&p);
  Tensor workspace = empty({static_cast<int64_t>(bytes > 0 ? bytes : 1)}, aoti_torch_dtype_uint8(), q);
  poison(workspace, stream);  // the kernels must not read what they did not write
  p.workspace = workspace.data_ptr();
  p.workspace_bytes = bytes;
  check_status(omni_bwd(&p), "omni_bwd");
  return {dq, dk, dv};
}

using Lists = std::tuple<Tensor, Tensor, Tensor, Tensor>;

// Empty num int32 [B, 1, rows], indices int32, types int8 and pool ids int32 [B, 1, rows, cols].
Lists list_outputs(int64_t batch, int64_t rows, int64_t cols, const Tensor& like) {
  return {empty({batch, 1, rows}, aoti_torch_dtype_int32(), like),
          empty({batch, 1, rows, cols}, aoti_torch_dtype_int32(), like),
          empty({batch, 1, rows, cols}, aoti_torch_dtype_int8(), like),
          empty({batch, 1, rows, cols}, aoti_torch_dtype_int32(), like)};
}

OmniBlockListOut list_view(const Lists& lists) {
  return {static_cast<int32_t*>(std::get<0>(lists).data_ptr()), static_cast<int32_t*>(std::get<1>(lists).data_ptr()),
          static_cast<int8_t*>(std::get<2>(lists).data_ptr()), static_cast<int32_t*>(std::get<3>(lists).data_ptr())};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> token_mask(
    Tensor doc, Tensor grp, int64_t q_len, int64_t block_q, int64_t block_kv, int64_t window,
    bool window_covers_groups) {
  torch::stable::accelerator::DeviceGuard guard(doc.get_device_index());
  STD_TORCH_CHECK(doc.dim() == 2 && grp.dim() == 2 && doc.size(0) == grp.size(0) && doc.size(1) == grp.size(1),
                  "doc_ids, group_ids: expected one shape [B, kv_len]");
  OmniTokenMaskParams p{};
  p.doc_ids = static_cast<const int32_t*>(pointer(doc, ScalarType::Int, "doc_ids", doc.get_device_index()));
  p.group_ids = static_cast<const int32_t*>(pointer(grp, ScalarType::Int, "group_ids", doc.get_device_index()));
  const int64_t batch = doc.size(0), kv_len = doc.size(1);
  const int64_t num_q = (q_len + block_q - 1) / block_q, num_kv = (kv_len + block_kv - 1) / block_kv;
  const Lists row = list_outputs(batch, num_q, num_kv, doc), col = list_outputs(batch, num_kv, num_q, doc);
  const int64_t block_ints = (OMNI_TOKEN_SUMMARY_INTS * batch * (num_q + num_kv) + 3) / 4 * 4;
  const int64_t chunks = (kv_len + OMNI_TOKEN_RANGE_CHUNK - 1) / OMNI_TOKEN_RANGE_CHUNK;
  Tensor workspace =
      empty({block_ints + OMNI_TOKEN_RANGE_SUMMARY_INTS * batch * chunks}, aoti_torch_dtype_int32(), doc);
  Tensor ranges = empty({batch, kv_len, 4}, aoti_torch_dtype_int32(), doc);
  p.batch = static_cast<int32_t>(batch);
  p.q_len = static_cast<int32_t>(q_len);
  p.kv_len = static_cast<int32_t>(kv_len);
  p.block_q = static_cast<int32_t>(block_q);
  p.block_kv = static_cast<int32_t>(block_kv);
  p.window = static_cast<int32_t>(window);
  p.window_covers_groups = window_covers_groups ? 1 : 0;
  p.kv = list_view(row);
  p.q = list_view(col);
  p.workspace = static_cast<int32_t*>(workspace.data_ptr());
  p.token_ranges = static_cast<int32_t*>(ranges.data_ptr());
  p.stream = current_stream(doc);
  check_status(omni_build_token_mask(&p), "omni_build_token_mask");
  return std::tuple_cat(row, col, std::make_tuple(ranges));
}

}  // namespace

extern "C" void omni_set_poison_outputs(int on) { g_poison_outputs = on != 0; }

STABLE_TORCH_LIBRARY_FRAGMENT(omni_hf, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? num_blocks, Tensor? indices, Tensor? types, Tensor? partial, "
      "Tensor? pool, Tensor? doc_ids, Tensor? group_ids, Tensor? token_ranges, int kind, int block_q, int block_kv, "
      "int window, bool window_covers_groups, float scale, float softcap, Tensor? sinks, Tensor? bias=None) "
      "-> (Tensor, Tensor)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? num_blocks, Tensor? indices, "
      "Tensor? types, Tensor? partial, Tensor? pool, Tensor? doc_ids, Tensor? group_ids, Tensor? token_ranges, "
      "int kind, int block_q, int block_kv, int window, bool window_covers_groups, float scale, float softcap, "
      "Tensor? bias=None, Tensor(a!)? dbias=None, Tensor? sinks=None, Tensor(a!)? dsinks=None, "
      "bool deterministic=False, Tensor? row_num_blocks=None, Tensor? row_indices=None, Tensor? row_types=None, "
      "Tensor? row_partial=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "token_mask(Tensor doc_ids, Tensor group_ids, int q_len, int block_q, int block_kv, int window, "
      "bool window_covers_groups) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

STABLE_TORCH_LIBRARY_IMPL(omni_hf, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&fwd));
  m.impl("bwd", TORCH_BOX(&bwd));
  m.impl("token_mask", TORCH_BOX(&token_mask));
}
