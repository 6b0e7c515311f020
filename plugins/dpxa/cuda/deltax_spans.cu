// dpxa mode=deltax on CUDA: the description of DeltaXAttention the core kernel's attention
// variant attends (the same rows as cpu/deltax_attend_cpu.cpp's):
//   deltax_packed  a CTA per (key block, KV head): the block's anchors (block_pack_cuda.hpp's
//                  offsets) as packed keys, position jB + offset and count = keys up to the next
//                  anchor of the block (or its end);
//   deltax_spans   a warp per (query block, q head) row: one span per kept tile (at most the
//                  row's candidates), in the selection's order — exact (sink, diagonal, or its bit in exact_bits): KEYS
//                  [jB, min((j+1)B, n)); packed: PACKED over the block's anchors. Entries outside
//                  the row's candidates become empty spans (the host cannot be told without a
//                  synchronisation; the plugin's own select never writes them).
#include <cuda_runtime.h>

#include "cuda/deltax_spans.hpp"
#include "math/dpxa_tiles.hpp"
#include "sieve/attention.h"

namespace sieve::dpxa {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) deltax_packed(const DeltaxLaunch a) {
  const int32_t j = blockIdx.x, kvh = blockIdx.y;
  const int32_t n = a.n_anchors[int64_t(kvh) * a.KB + j];
  const int32_t nk = int32_t(min(int64_t(a.B), a.kv_len - int64_t(j) * a.B));
  const uint8_t* offs = a.anchor_off + (int64_t(kvh) * a.KB + j) * a.B;
  const int64_t at = a.packed_base + int64_t(kvh) * a.max_seq_len + int64_t(j) * a.B;
  for (int32_t c = threadIdx.x; c < n; c += kThreads) {
    const int32_t next = c + 1 < n ? int32_t(offs[c + 1]) : nk;
    a.packed_pos[at + c] = j * a.B + offs[c];
    a.packed_count[at + c] = next - int32_t(offs[c]);
  }
}

__global__ void __launch_bounds__(32) deltax_spans(const DeltaxLaunch a) {
  const int32_t t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int32_t group = a.hq / a.hkv, kvh = h / group;
  const RowSpan span = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t sel_row = a.sel_row0 + int64_t(t) * a.H + (a.rows_per_kv_head ? kvh : h);
  const int32_t e0 = a.sel_indptr[sel_row];
  // A row holds at most its candidates (ascending and in range, the plugin's own select's): its
  // spans sit at [first, first + n) of this (sequence, q head)'s stretch, after the earlier query
  // blocks' candidates; entries past that many become nothing.
  const int32_t n = min(a.sel_indptr[sel_row + 1] - e0, span.n_candidates);
  const int64_t first = a.span_base + int64_t(h) * a.span_stride + row_prefix(a.kv_len, a.n_new, a.B, t);
  const uint32_t* bits = a.exact_bits + (int64_t(t) * a.hq + h) * a.exact_words;
  for (int32_t i = lane; i < n; i += 32) {
    const int32_t j = a.sel_indices[e0 + i];
    int32_t* out = a.spans + (first + i) * 3;
    if (j < 0 || j >= span.n_candidates) {
      out[0] = SIEVE_SPAN_KEYS, out[1] = 0, out[2] = 0;
      continue;
    }
    const bool exact = forced(span, j) || (j < a.exact_words * 32 && ((bits[j >> 5] >> (j & 31)) & 1u));
    if (exact) {
      out[0] = SIEVE_SPAN_KEYS, out[1] = j * a.B, out[2] = int32_t(min(int64_t(j + 1) * a.B, a.kv_len));
    } else {
      const int64_t at = a.packed_base + int64_t(kvh) * a.max_seq_len + int64_t(j) * a.B;
      out[0] = SIEVE_SPAN_PACKED, out[1] = int32_t(at), out[2] = int32_t(at + a.n_anchors[int64_t(kvh) * a.KB + j]);
    }
  }
  if (lane == 0) {
    const int64_t row = a.var_row0 + int64_t(t) * a.hq + h;
    a.row_spans[2 * row] = int32_t(first);
    a.row_spans[2 * row + 1] = int32_t(first + n);
  }
}

const char* last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_deltax_spans(const DeltaxLaunch& a) noexcept {
  if (a.QB <= 0) return nullptr;
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.KB > 0) {
    deltax_packed<<<dim3(unsigned(a.KB), unsigned(a.hkv)), kThreads, 0, stream>>>(a);
    if (const char* e = last_error()) return e;
  }
  deltax_spans<<<dim3(unsigned(a.QB), unsigned(a.hq)), 32, 0, stream>>>(a);
  return last_error();
}

}  // namespace sieve::dpxa
