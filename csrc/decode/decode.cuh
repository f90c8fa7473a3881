// The decode path of the forward: calls with few query rows per KV head (q_len * heads_q / heads_kv <= 16:
// decoding, speculative verification) under an implicit mask. The main kernels give each query head a CTA with a
// 64- or 128-row tile and walk every key tile in sequence, which leaves most of the GPU idle and most of the tile
// empty; here the query heads of a KV head share one CTA per slice of the keys ("split-KV"), and a second kernel
// merges the slices by their log-sum-exp. Runs on sm_80 and sm_90 alike (plain FMA: the work is memory bound).
#pragma once
#include <cstddef>

#include "omni_attention.h"

namespace omni::decode {

// Query rows of one KV head (q_len * heads_q / heads_kv) the path takes; which calls it takes is
// host/tuning.cuh's fwd_takes_decode.
constexpr int kMaxRows = 16;

// Bytes of workspace the call needs (0 when its keys are not split).
size_t workspace_bytes(const OmniFwdParams& p);

// Launches the call (p.workspace must hold workspace_bytes(p)).
int run(const OmniFwdParams& p);

}  // namespace omni::decode
