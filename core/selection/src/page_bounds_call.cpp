#include "sieve/selection/page_bounds_call.hpp"

#include <sieve/util/error.hpp>
#include <sieve/util/tensor.hpp>

#include <string>

#if SIEVE_SELECTION_CUDA
#include "sieve/selection/page_bound_cuda.hpp"
#endif

namespace sieve::selection {

void launch_page_bounds_for_call(const sieve_layer_call& call, const DLTensor& sidecar,
                                 const sieve_geometry& g, int32_t max_pages, bool group_max,
                                 float* scores, ScoreLayout layout, void* stream) {
#if SIEVE_SELECTION_CUDA
  require(call.q && call.qo_indptr && call.kv_view, SIEVE_ERR_INVALID_ARGUMENT,
          "the decode call has no q, qo_indptr or view");
  const DLTensor& q = *call.q;
  PageBoundLaunch b{};
  b.q_dtype = require_storage(q.dtype, "q");
  require(q.ndim == 3 && q.shape[1] == g.n_q_heads &&
              q.shape[2] == g.head_dim && is_contiguous(q) && q.device.device_type == kDLCUDA &&
              call.qo_indptr->device.device_type == kDLCUDA,
          SIEVE_ERR_INVALID_ARGUMENT,
          "q must be a compact CUDA [n, " + std::to_string(g.n_q_heads) + ", " +
              std::to_string(g.head_dim) + "] f32/f16/bf16 tensor, with a device qo_indptr");
  const sieve_paged_kv& view = *call.kv_view;
  b.q = data_ptr<const void>(q);
  b.qo_indptr = data_ptr<const int32_t>(*call.qo_indptr);
  b.n_q_heads = g.n_q_heads;
  b.sidecar = data_ptr<const void>(sidecar);
  b.kv_dtype = require_storage(sidecar.dtype, "the page-bound sidecar");
  b.n_kv_heads = g.n_kv_heads;
  b.head_dim = g.head_dim;
  b.kv_indptr = data_ptr<const int32_t>(view.indptr);
  b.kv_indices = data_ptr<const int32_t>(view.indices);
  b.batch = call.batch;
  b.max_pages = max_pages;
  b.group_max = group_max;
  b.scores = scores;
  b.layout = layout;
  b.stream = stream;
  if (const char* e = launch_page_bounds(b)) fail(SIEVE_ERR_DEVICE, std::string("page bound kernel: ") + e);
#else
  (void)call, (void)sidecar, (void)g, (void)max_pages, (void)group_max, (void)scores, (void)layout,
      (void)stream;
  fail(SIEVE_ERR_UNSUPPORTED, "this build has no CUDA page bounds");
#endif
}

}  // namespace sieve::selection
