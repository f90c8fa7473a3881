// Host-side validation of OmniFwdParams shared by the forward and the backward entry points.
// Each check returns OMNI_OK or an OMNI_ERR_* status with a detail naming the failed check.
#pragma once
#include "omni_attention.h"

namespace omni {

// The current device runs sm_80 kernels (compute capability >= 8.0).
int check_device();

// `t` ([B, H, S, D] with the last dim contiguous) has a 16-byte aligned pointer and strides.
int check_tensor(const OmniTensor& t, const char* name);

// dtype, block sizes, lengths, heads, the mask's kind and every tensor's alignment (not the block lists: the
// forward reads the row view, the backward the column view, and each entry point checks its own).
// The head dim is checked by the dispatch, which knows its instantiations.
int check_call_params(const OmniFwdParams& p);

// One view of a mask given by block lists (OMNI_MASK_BLOCKS): pointers set, `rows` rows; `name` is "kv" or "q".
int check_list(const OmniBlockList& list, int rows, const char* name);

}  // namespace omni
