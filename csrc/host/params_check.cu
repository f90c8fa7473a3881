// Host-side validation of the call parameters (host/params_check.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "host/dispatch.cuh"
#include "host/launch.cuh"
#include "host/params_check.cuh"
#include "host/status.cuh"

namespace omni {

namespace {

constexpr int64_t kVectorElems = 8;  // 16 bytes of fp16 / bf16
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int check_shapes(const OmniFwdParams& p) {
  if (p.batch < 0 || p.q_len < 0 || p.kv_len < 0)
    return fail(OMNI_ERR_SHAPE, "negative size: batch=%d q_len=%d kv_len=%d", p.batch, p.q_len, p.kv_len);
  if (p.heads_q < 1 || p.heads_kv < 1 || p.heads_q % p.heads_kv != 0)
    return fail(OMNI_ERR_SHAPE, "heads_q=%d must be a positive multiple of heads_kv=%d", p.heads_q, p.heads_kv);
  if (p.mask.kind != OMNI_MASK_BLOCKS && p.mask.kind != OMNI_MASK_CAUSAL && p.mask.kind != OMNI_MASK_FULL)
    return fail(OMNI_ERR_SHAPE,
                "mask.kind=%d; expected OMNI_MASK_BLOCKS (0), OMNI_MASK_CAUSAL (1) or OMNI_MASK_FULL (2)", p.mask.kind);
  if (p.mask.kind != OMNI_MASK_BLOCKS && p.mask.heads != 1)
    return fail(OMNI_ERR_SHAPE, "mask.heads=%d; implicit masks (kind %d) have one head", p.mask.heads, p.mask.kind);
  if (p.mask.heads != 1 && p.mask.heads != p.heads_q)
    return fail(OMNI_ERR_SHAPE, "mask.heads=%d must be 1 or heads_q=%d", p.mask.heads, p.heads_q);
  if (p.batch > OMNI_MAX_GRID_YZ || ceil_div(p.q_len, p.mask.block_q) > OMNI_MAX_GRID_YZ)
    return fail(OMNI_ERR_SHAPE, "batch=%d or q_len/block_q=%lld exceeds the grid limit %d", p.batch,
                static_cast<long long>(ceil_div(p.q_len, p.mask.block_q)), OMNI_MAX_GRID_YZ);
  if (p.lse == nullptr) return fail(OMNI_ERR_SHAPE, "lse pointer is NULL");
  if (p.mask.num_partial > 0 && p.mask.partial_pool == nullptr)
    return fail(OMNI_ERR_SHAPE, "mask.partial_pool is NULL but num_partial=%d", p.mask.num_partial);
  if (p.mask.ids_stride_b < 0) return fail(OMNI_ERR_SHAPE, "mask.ids_stride_b is negative");
  return OMNI_OK;
}

int check_bias(const OmniFwdParams& p) {
  if (p.bias.ptr == nullptr) return OMNI_OK;
  if (p.bias.dtype != OMNI_FP32 && p.bias.dtype != OMNI_FP16 && p.bias.dtype != OMNI_BF16)
    return fail(OMNI_ERR_DTYPE, "bias.dtype=%d; expected OMNI_FP16 (0), OMNI_BF16 (1) or OMNI_FP32 (2)", p.bias.dtype);
  if (p.softcap > 0.f) return fail(OMNI_ERR_SHAPE, "bias with softcap=%g: the two are not combined", p.softcap);
  return OMNI_OK;
}

}  // namespace

int check_list(const OmniBlockList& list, int rows, const char* name) {
  if (list.num_blocks == nullptr || list.indices == nullptr || list.types == nullptr || list.partial == nullptr)
    return fail(OMNI_ERR_SHAPE, "mask.%s: a block-list pointer is NULL", name);
  if (list.num_rows != rows)
    return fail(OMNI_ERR_SHAPE, "mask.%s.num_rows = %d, expected %d for these lengths and block sizes", name,
                list.num_rows, rows);
  if (list.max_blocks < 0 || list.stride_b < 0 || list.stride_h < 0)
    return fail(OMNI_ERR_SHAPE, "mask.%s: negative max_blocks or stride", name);
  return OMNI_OK;
}

int check_device() {
  const int capability = compute_capability();  // looked up once per device
  if (capability >= OMNI_MIN_CAPABILITY) return OMNI_OK;
  int device = 0;
  if (int s = check_cuda(cudaGetDevice(&device), "cudaGetDevice")) return s;
  if (capability == 0) return fail(OMNI_ERR_CUDA, "the compute capability of device %d could not be read", device);
  return fail(OMNI_ERR_ARCH, "device %d has compute capability %d.%d; %d.%d or newer needed", device, capability / 10,
              capability % 10, OMNI_MIN_CAPABILITY / 10, OMNI_MIN_CAPABILITY % 10);
}

int check_tensor(const OmniTensor& t, const char* name) {
  if (t.ptr == nullptr) return fail(OMNI_ERR_ALIGNMENT, "%s: pointer is NULL", name);
  if (reinterpret_cast<uintptr_t>(t.ptr) % 16 != 0)
    return fail(OMNI_ERR_ALIGNMENT, "%s: data pointer %p is not 16-byte aligned", name, t.ptr);
  if (t.stride_b % kVectorElems || t.stride_h % kVectorElems || t.stride_s % kVectorElems)
    return fail(OMNI_ERR_ALIGNMENT, "%s: strides (b=%lld, h=%lld, s=%lld) must be multiples of 8 elements", name,
                static_cast<long long>(t.stride_b), static_cast<long long>(t.stride_h),
                static_cast<long long>(t.stride_s));
  return OMNI_OK;
}

int check_call_params(const OmniFwdParams& p) {
  if (p.dtype != OMNI_FP16 && p.dtype != OMNI_BF16)
    return fail(OMNI_ERR_DTYPE, "dtype=%d; expected OMNI_FP16 (0) or OMNI_BF16 (1)", p.dtype);
  if (!supported_block_size(p.mask.block_q) || !supported_block_size(p.mask.block_kv))
    return fail(OMNI_ERR_BLOCK_SIZE, "block_q=%d block_kv=%d; each must be " OMNI_BLOCK_SIZES_TEXT, p.mask.block_q,
                p.mask.block_kv);
  if (kernel_head_dim(p.head_dim) == 0)
    return fail(OMNI_ERR_HEAD_DIM,
                "head_dim=%d; expected a multiple of 8 up to the largest of the kernels' " OMNI_HEAD_DIMS_TEXT,
                p.head_dim);
  if (int s = check_shapes(p)) return s;
  if (int s = check_bias(p)) return s;
  if (int s = check_tensor(p.q, "q")) return s;
  if (int s = check_tensor(p.k, "k")) return s;
  if (int s = check_tensor(p.v, "v")) return s;
  return check_tensor(p.out, "out");
}

}  // namespace omni
