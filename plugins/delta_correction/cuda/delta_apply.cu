// CUDA half of delta_correction: builds the dense-row list on the device from qo_indptr, saves
// O*(anchor) before the core kernel's dense call overwrites those rows, then forms Δ and adds it
// to the rows each anchor corrects (correction_rows.hpp gives the rule, shared with the CPU path).
// f32 arithmetic whatever the output's dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "cuda/delta_apply.hpp"
#include "correction_rows.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::delta_correction {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 8192;

// One block walks the sequences in order (batches are small) and writes each one's rows in
// parallel; the bounds keep a device qo_indptr that disagrees with the host mirror in range.
__global__ void __launch_bounds__(kThreads) rows_kernel(ApplyLaunch a) {
  int64_t dense_base = 0, anchor_base = 0;  // identical in every thread
  for (int32_t b = 0; b < a.batch; ++b) {
    const int32_t first = a.qo_indptr[b];
    const SeqRows r = seq_rows(a.qo_indptr[b + 1] - first, a.gamma, a.tail);
    if (threadIdx.x == 0) {
      a.seq_offsets[b] = int32_t(dense_base);
      a.seq_offsets[a.batch + 1 + b] = int32_t(anchor_base);
    }
    for (int64_t j = threadIdx.x; j < r.dense_rows(); j += kThreads)
      if (dense_base + j < a.n_dense) a.q_rows[dense_base + j] = int32_t(first + r.dense_row(j, a.gamma));
    for (int64_t k = threadIdx.x; k < r.anchors; k += kThreads)
      if (anchor_base + k < a.n_anchors) a.anchor_tokens[anchor_base + k] = int32_t(first + k * a.gamma);
    dense_base += r.dense_rows();
    anchor_base += r.anchors;
  }
  if (threadIdx.x == 0) {
    a.seq_offsets[a.batch] = int32_t(dense_base);
    a.seq_offsets[2 * a.batch + 1] = int32_t(anchor_base);
  }
}

// One block per anchor row (grid-stride): saved = O*(anchor) or, with `delta`, out − saved.
__global__ void __launch_bounds__(kThreads) anchor_kernel(ApplyLaunch a, bool delta) {
  for (int64_t k = blockIdx.x; k < a.n_anchors; k += gridDim.x) {
    const int64_t src = int64_t(a.anchor_tokens[k]) * a.row_elems;
    float* dst = a.saved + k * a.row_elems;
    for (int64_t e = threadIdx.x; e < a.row_elems; e += kThreads) {
      const float o = load_storage(a.out, a.out_dtype, src + e);
      dst[e] = delta ? o - dst[e] : o;
    }
  }
}

// The bits of a 16-bit storage element and back (no address taken: the values stay in registers).
template <class T>
__device__ __forceinline__ T bits_as(unsigned short b);
template <>
__device__ __forceinline__ __nv_bfloat16 bits_as<__nv_bfloat16>(unsigned short b) { return __ushort_as_bfloat16(b); }
template <>
__device__ __forceinline__ __half bits_as<__half>(unsigned short b) { return __ushort_as_half(b); }
__device__ __forceinline__ unsigned short as_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ unsigned short as_bits(__half x) { return __half_as_ushort(x); }

// Two packed 16-bit elements plus their deltas, in f32, rounded back once.
template <class T>
__device__ __forceinline__ uint32_t add_delta_pair(uint32_t packed, float delta_lo, float delta_hi) {
  const unsigned short lo = packed & 0xffffu, hi = packed >> 16;
  const T a = from_f32<T>(to_f32<T>(bits_as<T>(lo)) + delta_lo), b = from_f32<T>(to_f32<T>(bits_as<T>(hi)) + delta_hi);
  return uint32_t(as_bits(a)) | uint32_t(as_bits(b)) << 16;
}

// out[0, n) += (1 − w) d0 + w d1 for a 16-bit out, 8 elements (one 16-byte access) a thread: the
// element-wise loop's 2-byte accesses kept this pass, which reads and writes every corrected row,
// at a quarter of the copy bandwidth (2.0 ms for 1.07 GB of bf16 at 128K, 32q x 128, on an H200).
// Same arithmetic as the element-wise loop (f32, one rounding to T). n % 8 == 0, 16-byte aligned.
template <class T>
__device__ __forceinline__ void add_delta_x8(T* out, const float* d0, const float* d1, float w, int64_t n) {
  for (int64_t e = int64_t(threadIdx.x) * 8; e < n; e += int64_t(kThreads) * 8) {
    uint4 raw = *reinterpret_cast<const uint4*>(out + e);
    for (int h = 0; h < 2; ++h) {  // 4 elements at a time: fewer values live at once
      const float4 a = *reinterpret_cast<const float4*>(d0 + e + 4 * h);
      const float4 b = *reinterpret_cast<const float4*>(d1 + e + 4 * h);
      uint32_t& p0 = h == 0 ? raw.x : raw.z;
      uint32_t& p1 = h == 0 ? raw.y : raw.w;
      p0 = add_delta_pair<T>(p0, (1.f - w) * a.x + w * b.x, (1.f - w) * a.y + w * b.y);
      p1 = add_delta_pair<T>(p1, (1.f - w) * a.z + w * b.z, (1.f - w) * a.w + w * b.w);
    }
    *reinterpret_cast<uint4*>(out + e) = raw;
  }
}

// One block per query token (grid-stride): the token's sequence by binary search over qo_indptr,
// its role, and for a corrected row out += (1 − w) Δ_a + w Δ_{a+1}.
__global__ void __launch_bounds__(kThreads) update_kernel(ApplyLaunch a) {
  // 16-bit rows of whole 16-byte chunks, 16-byte aligned (out's rows and saved's f32 rows alike).
  const bool vec16 = a.out_dtype != Storage::f32 && a.row_elems % 8 == 0 &&
                     (reinterpret_cast<uintptr_t>(a.out) | reinterpret_cast<uintptr_t>(a.saved)) % 16 == 0;
  for (int64_t tok = blockIdx.x; tok < a.n_tokens; tok += gridDim.x) {
    int32_t lo = 0, hi = a.batch - 1;  // the last b with qo_indptr[b] <= tok
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      if (a.qo_indptr[mid] <= tok) lo = mid;
      else hi = mid - 1;
    }
    const int32_t b = lo;
    const int64_t l = tok - a.qo_indptr[b];
    const SeqRows r = seq_rows(a.qo_indptr[b + 1] - a.qo_indptr[b], a.gamma, a.tail);
    if (l < 0 || l >= r.s || row_role(r, l, a.gamma) != RowRole::kCorrected) continue;
    const int64_t k = a.seq_offsets[a.batch + 1 + b] + l / a.gamma;
    if (k >= a.n_anchors) continue;
    const float w = next_anchor_weight(r, l, a.gamma, a.interpolate);
    const float* d0 = a.saved + k * a.row_elems;
    const float* d1 = w > 0.f && k + 1 < a.n_anchors ? d0 + a.row_elems : d0;
    const int64_t base = tok * a.row_elems;
    if (vec16 && a.out_dtype == Storage::bf16) {
      add_delta_x8(static_cast<__nv_bfloat16*>(a.out) + base, d0, d1, w, a.row_elems);
    } else if (vec16) {
      add_delta_x8(static_cast<__half*>(a.out) + base, d0, d1, w, a.row_elems);
    } else {
      for (int64_t e = threadIdx.x; e < a.row_elems; e += kThreads) {
        const float delta = (1.f - w) * d0[e] + w * d1[e];
        store_storage(a.out, a.out_dtype, base + e, load_storage(a.out, a.out_dtype, base + e) + delta);
      }
    }
  }
}

// ---- The tiled anchor path ----------------------------------------------------------------------

__device__ __forceinline__ int64_t resident(const TiledLaunch& t, int32_t b) {
  const int32_t pages = t.kv_indptr[b + 1] - t.kv_indptr[b];
  return pages > 0 ? int64_t(pages - 1) * t.page_size + t.last_page_len[b] : 0;
}

// One block: per sequence (in order) the anchor and tail token lists, the compacted offsets, and
// the CSR indptr of both selections (row counts in closed form, correction_rows.hpp; a block scan per
// chunk of rows). Running totals are identical in every thread (the scans broadcast totals).
__global__ void __launch_bounds__(kThreads) tiled_setup_kernel(TiledLaunch t) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const ApplyLaunch& a = t.base;
  const int64_t qa = t.anchor_block;
  int32_t anchor_base = 0, tail_base = 0, bulk_row = 0, near_row = 0, bulk_nnz = 0, near_nnz = 0;
  for (int32_t b = 0; b < a.batch; ++b) {
    const int32_t first = a.qo_indptr[b];
    const SeqRows r = seq_rows(a.qo_indptr[b + 1] - first, a.gamma, a.tail);
    const int64_t kv_len = resident(t, b);
    const int32_t nb = int32_t(anchor_blocks(r, qa)), nn = int32_t(near_rows(r, qa, a.gamma));
    if (threadIdx.x == 0) {
      a.seq_offsets[a.batch + 1 + b] = anchor_base;
      t.qo_anchor[b] = anchor_base;
      t.qo_tail[b] = tail_base;
      t.row_bases[b] = bulk_row;
      t.row_bases[a.batch + 1 + b] = near_row;
    }
    for (int64_t k = threadIdx.x; k < r.anchors; k += kThreads)
      if (anchor_base + k < a.n_anchors) a.anchor_tokens[anchor_base + k] = int32_t(first + k * a.gamma);
    for (int64_t j = threadIdx.x; j < r.tail_rows(); j += kThreads)
      if (tail_base + j < t.n_tail) t.tail_tokens[tail_base + j] = int32_t(first + r.s_p + j);
    for (int32_t c = 0; c < nb; c += kThreads) {
      const int32_t row = c + int32_t(threadIdx.x);
      const int32_t n = row < nb ? int32_t(bulk_blocks(r, kv_len, row, qa, a.gamma, t.page_size, t.k_block_pages)) : 0;
      int32_t prefix, total;
      Scan(temp).ExclusiveSum(n, prefix, total);
      if (row < nb && bulk_row + row < t.n_bulk_rows) t.bulk_indptr[bulk_row + row] = bulk_nnz + prefix;
      bulk_nnz += total;
      __syncthreads();
    }
    for (int32_t c = 0; c < nn; c += kThreads) {
      const int32_t row = c + int32_t(threadIdx.x);
      const int32_t n = row < nn ? int32_t(near_pages(r, kv_len, row, qa, a.gamma, t.page_size, t.k_block_pages)) : 0;
      int32_t prefix, total;
      Scan(temp).ExclusiveSum(n, prefix, total);
      if (row < nn && near_row + row < t.n_near_rows) t.near_indptr[near_row + row] = near_nnz + prefix;
      near_nnz += total;
      __syncthreads();
    }
    anchor_base += int32_t(r.anchors);
    tail_base += int32_t(r.tail_rows());
    bulk_row += nb;
    near_row += nn;
  }
  if (threadIdx.x == 0) {
    a.seq_offsets[2 * a.batch + 1] = anchor_base;
    t.qo_anchor[a.batch] = anchor_base;
    t.qo_tail[a.batch] = tail_base;
    t.row_bases[a.batch] = bulk_row;
    t.row_bases[2 * a.batch + 1] = near_row;
    t.bulk_indptr[t.n_bulk_rows] = bulk_nnz;
    t.near_indptr[t.n_near_rows] = near_nnz;
  }
}

// The last b with bases[b] <= row (skips sequences without rows).
__device__ int32_t sequence_of(const int32_t* bases, int32_t batch, int32_t row) {
  int32_t lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (bases[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The lists: blockIdx.y 0 = bulk rows (key blocks [0, bulk)), 1 = near rows (pages).
__global__ void __launch_bounds__(kThreads) tiled_pages_kernel(TiledLaunch t) {
  const ApplyLaunch& a = t.base;
  const bool near = blockIdx.y == 1;
  const int32_t n_rows = near ? t.n_near_rows : t.n_bulk_rows;
  const int32_t* bases = near ? t.row_bases + a.batch + 1 : t.row_bases;
  for (int32_t row = blockIdx.x; row < n_rows; row += gridDim.x) {
    const int32_t b = sequence_of(bases, a.batch, row);
    const int64_t tb = row - bases[b];
    const SeqRows r = seq_rows(a.qo_indptr[b + 1] - a.qo_indptr[b], a.gamma, a.tail);
    const int64_t kv_len = resident(t, b);
    const int64_t bulk = bulk_blocks(r, kv_len, tb, t.anchor_block, a.gamma, t.page_size, t.k_block_pages);
    const int64_t from = near ? bulk * t.k_block_pages : 0;
    const int64_t n =
        near ? near_pages(r, kv_len, tb, t.anchor_block, a.gamma, t.page_size, t.k_block_pages) : bulk;
    const int64_t offset = near ? t.near_indptr[row] : t.bulk_indptr[row];
    const int64_t cap = near ? t.near_capacity : t.bulk_capacity;
    int32_t* indices = near ? t.near_indices : t.bulk_indices;
    for (int64_t j = threadIdx.x; j < n; j += kThreads)
      if (offset + j < cap) indices[offset + j] = int32_t(from + j);
  }
}

// q rows of the anchors and the tail rows into their compacted buffers (one block per row).
__global__ void __launch_bounds__(kThreads) tiled_gather_kernel(TiledLaunch t) {
  const ApplyLaunch& a = t.base;
  const int64_t rows = a.n_anchors + t.n_tail;
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const bool anchor = i < a.n_anchors;
    const int64_t src = int64_t(anchor ? a.anchor_tokens[i] : t.tail_tokens[i - a.n_anchors]) * a.row_elems;
    void* dst = anchor ? t.q_anchor : t.q_tail;
    const int64_t at = (anchor ? i : i - a.n_anchors) * a.row_elems;
    for (int64_t e = threadIdx.x; e < a.row_elems; e += kThreads)
      if (t.q_dtype == Storage::f32) static_cast<float*>(dst)[at + e] = static_cast<const float*>(t.q)[src + e];
      else static_cast<uint16_t*>(dst)[at + e] = static_cast<const uint16_t*>(t.q)[src + e];
  }
}

// An anchor's dense row from its bulk and near parts: o = (e^{lse_b} o_b + e^{lse_n} o_n) / (e^{lse_b}
// + e^{lse_n}) in f32, written to out; in delta mode saved (O*) becomes Δ = o − O*.
__global__ void __launch_bounds__(kThreads) tiled_merge_kernel(TiledLaunch t) {
  const ApplyLaunch& a = t.base;
  for (int64_t k = blockIdx.x; k < a.n_anchors; k += gridDim.x) {
    const int64_t tok = a.anchor_tokens[k];
    for (int64_t e = threadIdx.x; e < a.row_elems; e += kThreads) {
      const int64_t h = e / t.head_dim;
      const float lb = t.lse_bulk[k * t.n_q_heads + h], ln = t.lse_near[tok * t.n_q_heads + h];
      const float mx = fmaxf(lb, ln);
      float o = 0.f;
      if (mx != -INFINITY) {
        const float wb = lb == -INFINITY ? 0.f : __expf(lb - mx), wn = ln == -INFINITY ? 0.f : __expf(ln - mx);
        const float on = load_storage(a.out, a.out_dtype, tok * a.row_elems + e);
        o = (wb * t.out_bulk[k * a.row_elems + e] + wn * on) / (wb + wn);
      }
      if (t.delta) a.saved[k * a.row_elems + e] = o - a.saved[k * a.row_elems + e];
      store_storage(a.out, a.out_dtype, tok * a.row_elems + e, o);
    }
  }
}

__global__ void __launch_bounds__(kThreads) tiled_scatter_tail_kernel(TiledLaunch t) {
  const ApplyLaunch& a = t.base;
  for (int64_t i = blockIdx.x; i < t.n_tail; i += gridDim.x) {
    const int64_t dst = int64_t(t.tail_tokens[i]) * a.row_elems, src = i * a.row_elems;
    for (int64_t e = threadIdx.x; e < a.row_elems; e += kThreads)
      store_storage(a.out, a.out_dtype, dst + e, load_storage(t.out_tail, a.out_dtype, src + e));
  }
}

int grid_for(int64_t n) { return int(n < kMaxBlocks ? (n > 0 ? n : 1) : kMaxBlocks); }

const char* last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_rows(const ApplyLaunch& a) noexcept {
  rows_kernel<<<1, kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(a);
  return last_error();
}

const char* launch_save_anchors(const ApplyLaunch& a) noexcept {
  if (a.n_anchors <= 0) return nullptr;
  anchor_kernel<<<grid_for(a.n_anchors), kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(a, false);
  return last_error();
}

const char* launch_apply(const ApplyLaunch& a) noexcept {
  if (a.n_anchors <= 0) return nullptr;
  auto stream = static_cast<cudaStream_t>(a.stream);
  anchor_kernel<<<grid_for(a.n_anchors), kThreads, 0, stream>>>(a, true);
  if (const char* e = last_error()) return e;
  update_kernel<<<grid_for(a.n_tokens), kThreads, 0, stream>>>(a);
  return last_error();
}

const char* launch_tiled_setup(const TiledLaunch& t) noexcept {
  auto stream = static_cast<cudaStream_t>(t.base.stream);
  tiled_setup_kernel<<<1, kThreads, 0, stream>>>(t);
  if (const char* e = last_error()) return e;
  const int64_t rows = t.n_bulk_rows > t.n_near_rows ? t.n_bulk_rows : t.n_near_rows;
  tiled_pages_kernel<<<dim3(grid_for(rows), 2), kThreads, 0, stream>>>(t);
  return last_error();
}

const char* launch_tiled_gather(const TiledLaunch& t) noexcept {
  const int64_t rows = t.base.n_anchors + t.n_tail;
  if (rows <= 0) return nullptr;
  tiled_gather_kernel<<<grid_for(rows), kThreads, 0, static_cast<cudaStream_t>(t.base.stream)>>>(t);
  return last_error();
}

const char* launch_tiled_finish(const TiledLaunch& t) noexcept {
  auto stream = static_cast<cudaStream_t>(t.base.stream);
  if (t.base.n_anchors > 0) {
    tiled_merge_kernel<<<grid_for(t.base.n_anchors), kThreads, 0, stream>>>(t);
    if (const char* e = last_error()) return e;
  }
  if (t.n_tail > 0) {
    tiled_scatter_tail_kernel<<<grid_for(t.n_tail), kThreads, 0, stream>>>(t);
    if (const char* e = last_error()) return e;
  }
  if (t.delta && t.base.n_anchors > 0) {
    update_kernel<<<grid_for(t.base.n_tokens), kThreads, 0, stream>>>(t.base);
    return last_error();
  }
  return nullptr;
}

}  // namespace sieve::delta_correction
