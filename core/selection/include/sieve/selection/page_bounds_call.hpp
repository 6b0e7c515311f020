// The glue between a decode call and the CUDA bound kernel (page_bound_cuda.hpp), shared by the
// policies that score pages on the device (quest, raas): checks q and fills
// PageBoundLaunch from the call's view and the min/max sidecar, then enqueues it on `stream`.
#pragma once
#include <sieve/policy.h>

#include "sieve/selection/top_k.hpp"

namespace sieve::selection {

// Bounds of every resident page for each sequence's last query, on CUDA: scores[j * item_stride
// + h * head_stride] for page j of the view's page table (j = indptr[b] + logical page) and
// query head h (group_max: KV head h, the max over its query heads). q must be a compact CUDA
// [n, n_q_heads, head_dim] f32/f16/bf16 tensor with a device qo_indptr; `max_pages` is the
// largest page count of the call (check_decode_call's result). Throws sieve::Error:
// INVALID_ARGUMENT for a bad q, DEVICE when the launch fails, UNSUPPORTED in a build without CUDA.
void launch_page_bounds_for_call(const sieve_layer_call& call, const DLTensor& sidecar,
                                 const sieve_geometry& g, int32_t max_pages, bool group_max,
                                 float* scores, ScoreLayout layout, void* stream);

}  // namespace sieve::selection
