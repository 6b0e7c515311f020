// CUDA half of the streaming plugin: writes a StreamingLLM selection (sink + window pages per
// row) into device-resident CSR lists, reading the lengths from device tensors the host already
// has there (the view's page-table indptr / last_page_len and qo_indptr), so nothing is uploaded,
// allocated or synchronised per call.
//   kernel 1 (one block): rows per sequence -> row_start (scratch), then each row's page count
//                         (streaming_rows.hpp) -> exclusive scan -> selection indptr;
//   kernel 2 (a block per row, grid-stride): the row's pages -> selection indices.
// Rows are few (decode: one per sequence; prefill: one per page of new queries), so a single
// block with a chunked cub::BlockScan is enough for the scan.
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include "cuda/streaming_select.hpp"
#include "streaming_rows.hpp"

namespace sieve::streaming {
namespace {

constexpr int kScanThreads = 256;
constexpr int kRowThreads = 128;
constexpr int kMaxRowBlocks = 4096;

// The page list of selection row r: find its sequence (the last b with row_start[b] <= r, which
// skips sequences without queries) and its query block.
__device__ RowPages row_of(const SelectLaunch& a, int32_t r) {
  int32_t lo = 0, hi = a.batch - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (a.row_start[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  const int32_t b = lo;
  const int64_t kv_len =
      resident_tokens(a.kv_indptr[b + 1] - a.kv_indptr[b], a.last_page_len[b], a.page_size);
  const int64_t n_new = a.qo_indptr[b + 1] - a.qo_indptr[b];
  return block_pages(kv_len, n_new, a.q_block, r - a.row_start[b], a.sink, a.window, a.page_size);
}

__global__ void __launch_bounds__(kScanThreads) streaming_row_offsets(SelectLaunch a) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;

  int32_t running = 0;  // identical in every thread: the scan broadcasts the chunk's total
  for (int32_t base = 0; base < a.batch; base += kScanThreads) {
    const int32_t b = base + int32_t(threadIdx.x);
    const int32_t blocks =
        b < a.batch ? query_blocks(a.qo_indptr[b + 1] - a.qo_indptr[b], a.q_block) : 0;
    int32_t prefix, total;
    Scan(temp).ExclusiveSum(blocks, prefix, total);
    if (b < a.batch) a.row_start[b] = running + prefix;
    running += total;
    __syncthreads();  // temp is reused by the next chunk
  }
  if (threadIdx.x == 0) a.row_start[a.batch] = running;
  __syncthreads();  // row_start is read by every thread below

  running = 0;
  for (int32_t base = 0; base < a.n_rows; base += kScanThreads) {
    const int32_t r = base + int32_t(threadIdx.x);
    const int32_t count = r < a.n_rows ? row_of(a, r).count() : 0;
    int32_t prefix, total;
    Scan(temp).ExclusiveSum(count, prefix, total);
    if (r < a.n_rows) a.sel_indptr[r] = running + prefix;
    running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) a.sel_indptr[a.n_rows] = running;
}

__global__ void __launch_bounds__(kRowThreads) streaming_row_pages(SelectLaunch a) {
  for (int32_t r = int32_t(blockIdx.x); r < a.n_rows; r += int32_t(gridDim.x)) {
    const RowPages pages = row_of(a, r);
    const int64_t offset = a.sel_indptr[r];
    const int32_t n = pages.count();
    for (int32_t j = int32_t(threadIdx.x); j < n; j += kRowThreads)
      // The host checked the total against the capacity from its mirrors of these lengths; the
      // bound keeps a store whose mirrors disagree with its device arrays from writing past it.
      if (offset + j < a.capacity) a.sel_indices[offset + j] = pages.page(j);
  }
}

}  // namespace

const char* launch_streaming_select(const SelectLaunch& a) noexcept {
  auto stream = static_cast<cudaStream_t>(a.stream);
  streaming_row_offsets<<<1, kScanThreads, 0, stream>>>(a);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  if (a.n_rows > 0) {
    const int grid = a.n_rows < kMaxRowBlocks ? a.n_rows : kMaxRowBlocks;
    streaming_row_pages<<<grid, kRowThreads, 0, stream>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  }
  return nullptr;
}

}  // namespace sieve::streaming
