// CUDA half of the delta plugin.
//   delta_scores (grid: page chunks x sequences): copy the Δ-layer's page statistics into the
//     plugin's scratch, forcing +inf on the page where a straddling recency window begins, so that
//     core/selection's batched top-k with a uniform tail of ceil(L/P) pages and k = K/P - ceil(L/P)
//     keeps exactly the pages of the CPU path's per-row plan (delta_page_plan.hpp): the window's pages
//     plus the best budget_pages - window earlier pages (the +inf page is picked first).
//   top-k: core/selection's launch_top_k_cuda on the same stream, into the stored selection.
//   copy_selection: the stored CSR into the chain's selection at sparse layers, one launch on the
//     host's stream.
// Lengths come from the view's device page table: nothing is uploaded, allocated or synchronised.
#include <cuda_runtime.h>

#include <cmath>
#include <sieve/selection/top_k_cuda.hpp>

#include "cuda/delta_select.hpp"
#include "delta_page_plan.hpp"

namespace sieve::delta {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) delta_scores(ObserveLaunch a) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t begin = a.kv_indptr[b];
  const int32_t n = a.kv_indptr[b + 1] - begin;
  const int64_t len = resident_tokens(n, a.last_page_len[b], a.page_size);
  const RowPlan plan = plan_row(len, a.recent, a.budget_pages, a.page_size);
  const int32_t aligned = aligned_window_pages(a.recent, a.page_size);
  // The window needs one page more than ceil(L/P) exactly when it straddles a page boundary.
  const int32_t forced = plan.window > aligned ? n - plan.window : -1;
  const int64_t items = int64_t(n) * a.heads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < items;
       i += int64_t(gridDim.x) * kThreads) {
    const int64_t at = int64_t(begin) * a.heads + i;
    a.scores[at] = int32_t(i / a.heads) == forced ? INFINITY : a.page_mass[at];
  }
}

// The stored selection into the chain's: offsets and indices in one launch (a sparse layer's
// only device work besides its attention; two cudaMemcpyAsync calls were two operations).
__global__ void __launch_bounds__(kThreads)
    copy_selection(int32_t* dst_indptr, int32_t* dst_indices, const int32_t* src_indptr,
                   const int32_t* src_indices, int32_t n_rows, int64_t nnz) {
  const int64_t n_offsets = int64_t(n_rows) + 1;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n_offsets + nnz;
       i += int64_t(gridDim.x) * kThreads) {
    if (i < n_offsets) dst_indptr[i] = src_indptr[i];
    else dst_indices[i - n_offsets] = src_indices[i - n_offsets];
  }
}

}  // namespace

size_t delta_topk_scratch_bytes(int32_t max_batch, int32_t heads, int32_t) noexcept {
  return selection::top_k_cuda_scratch_bytes(int64_t(max_batch) * heads);
}

const char* launch_delta_observe(const ObserveLaunch& a) noexcept {
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.batch <= 0) return nullptr;
  if (a.max_seq_pages > 0) {
    const int64_t items = int64_t(a.max_seq_pages) * a.heads;
    const int64_t chunks = (items + kThreads - 1) / kThreads;
    const dim3 grid(unsigned(chunks < 1024 ? chunks : 1024), unsigned(a.batch));
    delta_scores<<<grid, kThreads, 0, stream>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  }
  const int32_t aligned = aligned_window_pages(a.recent, a.page_size);
  selection::TopKCudaLaunch t{};
  t.scores = a.scores;
  t.layout = {a.heads, 1};  // [nnz_pages, heads], as page_mass
  t.seg_indptr = a.kv_indptr;
  t.n_segments = a.batch;
  t.rows_per_segment = a.heads;
  t.head = 0;
  t.tail = aligned;
  t.k = a.budget_pages > aligned ? a.budget_pages - aligned : 0;
  t.scratch = a.topk_scratch;
  t.sel_indptr = a.sel_indptr;
  t.sel_indices = a.sel_indices;
  t.capacity = a.capacity;
  t.stream = a.stream;
  return selection::launch_top_k_cuda(t);
}

const char* copy_delta_selection(int32_t* dst_indptr, int32_t* dst_indices,
                                 const int32_t* src_indptr, const int32_t* src_indices,
                                 int32_t n_rows, int64_t nnz, void* stream) noexcept {
  const int64_t items = int64_t(n_rows) + 1 + (nnz > 0 ? nnz : 0);
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  copy_selection<<<unsigned(blocks < 1024 ? blocks : 1024), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(dst_indptr, dst_indices, src_indptr,
                                                        src_indices, n_rows, nnz > 0 ? nnz : 0);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::delta
