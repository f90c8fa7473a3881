// Split-KV forwards: a query row's keys are cut into slices that separate CTAs attend to (the decode path,
// decode/decode.cuh). Each slice leaves its rows normalised by their own sums
// as fp32 partials in a workspace, [slices, rows] of (o [D], lse) with row n = (b * heads_q + head) * q_len + query;
// merge_slices combines them by their log-sum-exp into out and lse: lse = log sum_s exp(lse_s),
// o = sum_s exp(lse_s - lse) o_s (a row no slice saw gives o = 0, lse = -inf).
#pragma once
#include <cstddef>

#include "omni_attention.h"

namespace omni {

// The partials of `slices` slices in the call's workspace.
struct SplitPartials {
  float* o;    // [slices, B * Hq * q_len, D]
  float* lse;  // [slices, B * Hq * q_len]
  int slices;
};

// Bytes of workspace the partials of `slices` slices take (0 for one slice, which writes the output itself).
size_t split_workspace_bytes(const OmniFwdParams& p, int slices);

// The partials in p.workspace, or OMNI_ERR_WORKSPACE when it is missing or too small.
int split_partials(const OmniFwdParams& p, int slices, SplitPartials* partials);

// Launches the merge of the partials into p.out and p.lse.
int merge_slices(const OmniFwdParams& p, const SplitPartials& partials);

}  // namespace omni
