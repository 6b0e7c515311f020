// dpxa mode=deltax on CUDA: DeltaXAttention over the selection's kept tiles, the same arithmetic
// as cpu/deltax.cpp's attend_row up to f32 rounding order. A CTA per (32 query rows of one query
// block, q head), 4 threads per row (each a quarter of the head dimensions, interleaved), walks
// the row's kept tiles in ascending order; each tile is staged in shared memory TILE keys at a
// time (K and V as f32, coalesced row loads from the pages):
//   exact tile  (sink, diagonal, or its bit in exact_bits): keys [jB, min((j+1)B, n)), masked to
//               positions <= the row's;
//   packed tile the block's anchors (block_pack_cuda.hpp), logit + log(count) (count = keys up to
//               the next anchor of the block; packed tiles precede the query block, so whole).
// One online softmax (log2 domain, f32) per row over both kinds. The kept list is the device CSR
// the select wrote; entries outside the row's candidates are skipped (the host cannot be told
// without a synchronisation; the plugin's own select never writes them).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "math/dpxa_tiles.hpp"
#include "cuda/deltax_attend.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::dpxa {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = kThreads / 4;  // query rows per CTA
constexpr float kLog2e = 1.4426950408889634f;

// DCAP >= d (dimension capacity, zero-padded), TILE keys per shared-memory stage.
template <int DCAP, int TILE>
__global__ void __launch_bounds__(kThreads) deltax_attend_kernel(const DeltaxLaunch a) {
  constexpr int DPT = DCAP / 4;
  __shared__ float sk[TILE][DCAP];
  __shared__ float sv[TILE][DCAP];
  __shared__ int64_t s_pos[TILE];  // key position, -1: none
  __shared__ float s_bias[TILE];   // log2(count) of a packed anchor, 0 for exact keys
  const int tid = threadIdx.x, row = tid / 4, sub = tid % 4;
  const int32_t per_block = (a.B + kRows - 1) / kRows;
  const int32_t t = int32_t(blockIdx.x) / per_block, part = int32_t(blockIdx.x) % per_block;
  const int32_t h = blockIdx.y, kvh = h / (a.hq / a.hkv);
  const int32_t in_block = part * kRows + row;
  const int64_t i = int64_t(t) * a.B + in_block;
  const bool valid = in_block < a.B && i < a.n_new;
  const int64_t pos = a.kv_len - a.n_new + (valid ? i : 0);
  const RowSpan span = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t sel_row = a.sel_row0 + int64_t(t) * a.H + (a.rows_per_kv_head ? kvh : h);
  const int32_t e0 = a.sel_indptr[sel_row], e1 = a.sel_indptr[sel_row + 1];
  const uint32_t* bits = a.exact_bits + (int64_t(t) * a.hq + h) * a.exact_words;

  const float qscale = a.scale * kLog2e;
  const int64_t qrow = ((a.q_token0 + (valid ? i : 0)) * a.hq + h) * a.d;
  float q[DPT], o[DPT];
#pragma unroll
  for (int x = 0; x < DPT; ++x) {
    const int dim = sub + 4 * x;
    q[x] = dim < a.d ? load_storage(a.q, a.q_dtype, qrow + dim) * qscale : 0.f;
    o[x] = 0.f;
  }
  float m_run = -INFINITY, l_run = 0.f;

  for (int32_t e = e0; e < e1; ++e) {  // CTA-uniform loop: every thread reads the same entries
    const int32_t j = a.sel_indices[e];
    if (j < 0 || j >= span.n_candidates) continue;
    const bool exact = forced(span, j) ||
                       (j < a.exact_words * 32 && ((bits[j >> 5] >> (j & 31)) & 1u));
    const int64_t k_first = int64_t(j) * a.B;
    const int32_t nk = int32_t(min(int64_t(a.B), a.kv_len - k_first));
    const uint8_t* offs = a.anchor_off + (int64_t(kvh) * a.KB + j) * a.B;
    const int32_t n_items = exact ? nk : a.n_anchors[int64_t(kvh) * a.KB + j];
    for (int32_t c0 = 0; c0 < n_items; c0 += TILE) {
      __syncthreads();  // the previous stage is no longer read
      if (tid < TILE) {
        const int32_t c = c0 + tid;
        int64_t p = -1;
        float bias = 0.f;
        if (c < n_items) {
          if (exact) {
            p = k_first + c;
          } else {
            const int32_t next = c + 1 < n_items ? int32_t(offs[c + 1]) : nk;
            p = k_first + offs[c];
            bias = log2f(float(next - int32_t(offs[c])));
          }
        }
        s_pos[tid] = p;
        s_bias[tid] = bias;
      }
      __syncthreads();
      for (int el = tid; el < TILE * DCAP; el += kThreads) {
        const int r = el / DCAP, dim = el % DCAP;
        const int64_t p = s_pos[r];
        float kx = 0.f, vx = 0.f;
        if (p >= 0 && dim < a.d) {
          const int64_t off = a.kv_strides.row(a.pages[p / a.page_size], kvh, p % a.page_size) + dim;
          kx = load_storage(a.k_pages, a.kv_dtype, off);
          vx = load_storage(a.v_pages, a.kv_dtype, off);
        }
        sk[r][dim] = kx;
        sv[r][dim] = vx;
      }
      __syncthreads();
      float s[TILE];
      float mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < TILE; ++r) {
        float z = 0.f;
#pragma unroll
        for (int x = 0; x < DPT; ++x) z = fmaf(q[x], sk[r][sub + 4 * x], z);
        z += __shfl_xor_sync(0xffffffffu, z, 1);
        z += __shfl_xor_sync(0xffffffffu, z, 2);
        const int64_t p = s_pos[r];
        s[r] = p >= 0 && (!exact || p <= pos) ? z + s_bias[r] : -INFINITY;
        mx = fmaxf(mx, s[r]);
      }
      const float m_new = fmaxf(m_run, mx);
      if (m_new > -INFINITY) {  // else nothing is visible to this row yet
        const float alpha = exp2f(m_run - m_new);  // 0 on the first visible stage
        m_run = m_new;
        float sum = 0.f;
#pragma unroll
        for (int x = 0; x < DPT; ++x) o[x] *= alpha;
#pragma unroll
        for (int r = 0; r < TILE; ++r) {
          const float p = exp2f(s[r] - m_new);
          sum += p;
#pragma unroll
          for (int x = 0; x < DPT; ++x) o[x] = fmaf(p, sv[r][sub + 4 * x], o[x]);
        }
        l_run = l_run * alpha + sum;
      }
    }
  }
  if (!valid) return;
  const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
#pragma unroll
  for (int x = 0; x < DPT; ++x) {
    const int dim = sub + 4 * x;
    if (dim < a.d) store_storage(a.out, a.out_dtype, qrow + dim, o[x] * inv);
  }
}

template <int DCAP, int TILE>
const char* launch(const DeltaxLaunch& a) {
  const int32_t per_block = (a.B + kRows - 1) / kRows;
  deltax_attend_kernel<DCAP, TILE>
      <<<dim3(unsigned(a.QB * per_block), unsigned(a.hq)), kThreads, 0,
         static_cast<cudaStream_t>(a.stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_deltax_attend(const DeltaxLaunch& a) noexcept {
  if (a.QB <= 0) return nullptr;
  // Three widths cover every head dim the plugin accepts on CUDA (<= 256); 32 KiB of K/V stage.
  if (a.d <= 64) return launch<64, 32>(a);
  if (a.d <= 128) return launch<128, 32>(a);
  if (a.d <= 256) return launch<256, 16>(a);
  return "deltax: head_dim above 256";
}

}  // namespace sieve::dpxa
