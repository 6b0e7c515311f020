// Quest's fused CUDA select (quest_select_cuda.hpp): one CTA of 512 threads per (sequence, KV head).
//   bounds: a half-warp per page (pages hw, hw + 32, ...), the canonical sum of page_bound.hpp
//           (page_bound_device.cuh, so the CPU's bits); page ids fetched 16 at a time, 4 pages'
//           records in flight per half-warp; the order key of each (row, page) into the key buffer.
//   select: per row, the k-th best key by a radix select (4 passes of 8 bits: a 256-bin shared
//           histogram of the keys that match the digits found so far, then one warp finds the bin
//           that holds the k-th), then one block scan of (above, equal to) the threshold over
//           contiguous runs gives every thread its place: keys above it, then the lowest-indexed
//           keys equal to it — exactly the CPU's (key desc, index asc) top k.
// Row offsets come from the page counts (every row holds min(pages, budget) entries), so no pass
// over the kept counts; each CTA writes its rows' indptr.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "page_bound_device.cuh"
#include "sieve/selection/quest_select_cuda.hpp"

namespace sieve::selection {
namespace {

constexpr int kThreads = 512;
constexpr int kHalfWarps = kThreads / 16;
constexpr int kDepth = 4;              // pages per half-warp whose records are loaded at once
constexpr int32_t kSmemKeys = 12288;   // 48 KB of keys: more go to the global scratch

struct SelectShared {
  uint32_t hist[256];
  typename cub::BlockScan<uint64_t, kThreads>::TempStorage scan;
  int32_t digit, remaining;
};

__device__ __forceinline__ void put(const QuestSelectLaunch& a, int64_t at, int32_t v) {
  if (at < a.capacity) a.sel_indices[at] = v;
}

__device__ __forceinline__ int32_t row_entries(int32_t pages, int32_t budget) {
  return pages <= 0 ? 0 : (pages < budget ? pages : budget);
}

// Entries of one row of each sequence before b, summed; every warp computes it for itself.
__device__ int64_t entries_before(const QuestSelectLaunch& a, int32_t b) {
  const int lane = int(threadIdx.x & 31);
  int64_t s = 0;
  for (int32_t i = lane; i < b; i += 32)
    s += row_entries(__ldg(a.kv_indptr + i + 1) - __ldg(a.kv_indptr + i), a.budget_pages);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// Order keys of the middle pages [0, m) of sequence b for KV head kh: keys[g * m + j] for row g of
// the CTA (the group's query head g, or the group max when a.group_max). Vector path (G > 0):
// head_dim <= 128, lane p holds chunk p of the record and of the G heads' queries.
template <class T, int G>
__device__ void bound_keys(const QuestSelectLaunch& a, int32_t kh, int32_t begin, int32_t m,
                           int64_t q_row, uint32_t* keys) {
  const int32_t tid = int32_t(threadIdx.x), hw = tid >> 4, p = tid & 15;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim;
  const bool has = p * kBoundChunk < d;
  const bool q_ok = q_row >= 0;
  float qr[G][kBoundChunk];
  uint32_t sel[G][kBoundChunk / 2];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < kBoundChunk; ++i)
      qr[g][i] = has && q_ok ? load_any(a.q, a.q_dtype, (q_row * a.n_q_heads + kh * G + g) * d + p * kBoundChunk + i) : 0.f;
#pragma unroll
    for (int w = 0; w < kBoundChunk / 2; ++w) sel[g][w] = sign_selector(qr[g][2 * w], qr[g][2 * w + 1]);
  }
  const T* side = static_cast<const T*>(a.sidecar) + int64_t(kh) * 2 * d + p * kBoundChunk;
  const int64_t page_elems = int64_t(Hkv) * 2 * d;
  auto score = [&](int32_t j, const Chunk<T>& mn, const Chunk<T>& mx) {
    float best = 0.f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float acc = has ? chunk_sum<T>(qr[g], sel[g], mn, mx) : 0.f;
      acc = half_warp_sum(acc, mask);
      if (a.group_max) best = group_max_step(best, acc, g == 0);
      else if (p == 0) keys[int64_t(g) * m + j] = order_key(acc);
    }
    if (a.group_max && p == 0) keys[j] = order_key(best);
  };
  // The half-warp's pages j0, j0 + 32, ... in groups of 16: lane p fetches the physical id of the
  // group's page p, then kDepth pages' records are loaded before any is summed.
  for (int32_t j0 = hw; j0 < m; j0 += kBoundPartials * kHalfWarps) {
    const int32_t mine = j0 + p * kHalfWarps;
    const int32_t my_phys = mine < m ? __ldg(a.kv_indices + begin + mine) : 0;
    const int32_t left = (m - j0 + kHalfWarps - 1) / kHalfWarps;
    const int32_t cnt = left < kBoundPartials ? left : kBoundPartials;  // uniform in the half-warp
    for (int32_t k0 = 0; k0 < cnt; k0 += kDepth) {
      Chunk<T> mn[kDepth], mx[kDepth];
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        if (k0 + u >= cnt) break;
        const int64_t phys = __shfl_sync(mask, my_phys, k0 + u, 16);
        if (has) {
          const T* rec = side + phys * page_elems;
          mn[u].load(rec);
          mx[u].load(rec + d);
        }
      }
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        if (k0 + u >= cnt) break;
        score(j0 + (k0 + u) * kHalfWarps, mn[u], mx[u]);
      }
    }
  }
}

// Any head_dim, group size and alignment: the same sums element by element (G == 0).
template <class T>
__device__ void bound_keys_general(const QuestSelectLaunch& a, int32_t kh, int32_t begin, int32_t m,
                                   int64_t q_row, uint32_t* keys) {
  const int32_t tid = int32_t(threadIdx.x), hw = tid >> 4, p = tid & 15;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim, G = a.n_q_heads / Hkv;
  const T* side = static_cast<const T*>(a.sidecar);
  for (int32_t j = hw; j < m; j += kHalfWarps) {
    const T* mm = side + (int64_t(__ldg(a.kv_indices + begin + j)) * Hkv + kh) * 2 * d;
    float best = 0.f;
    for (int32_t g = 0; g < G; ++g) {
      const int64_t qbase = (q_row * a.n_q_heads + kh * G + g) * d;
      float acc = 0.f;
      for (int32_t chunk = p; chunk * kBoundChunk < d; chunk += kBoundPartials)
        for (int32_t c = chunk * kBoundChunk; c < d && c < (chunk + 1) * kBoundChunk; ++c)
          acc = bound_step(acc, q_row >= 0 ? load_any(a.q, a.q_dtype, qbase + c) : 0.f, to_f32(mm[c]),
                           to_f32(mm[d + c]));
      acc = half_warp_sum(acc, mask);
      if (a.group_max) best = group_max_step(best, acc, g == 0);
      else if (p == 0) keys[int64_t(g) * m + j] = order_key(acc);
    }
    if (a.group_max && p == 0) keys[j] = order_key(best);
  }
}

// One row: the k best of keys[0, m) (key desc, index asc; 0 < k < m) in ascending page order at
// out, then the last page n - 1 = m at out + k. Every thread calls it; ends with a barrier.
__device__ void select_row(const QuestSelectLaunch& a, SelectShared& sh, const uint32_t* keys, int32_t m,
                           int32_t k, int64_t out) {
  const int32_t tid = int32_t(threadIdx.x), lane = tid & 31;
  if (tid == 0) put(a, out + k, m);
  if (k <= 0) return;
  // Radix select: after the pass for `shift`, the k-th best key's digits above it are `prefix`,
  // and it is the `remaining`-th best of the keys sharing them.
  uint32_t prefix = 0, known = 0;
  int32_t remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    for (int32_t j = tid; j < m; j += kThreads) {
      const uint32_t key = keys[j];
      if ((key & known) == prefix) atomicAdd(&sh.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (tid < 32) {  // lane l holds bins 8l .. 8l + 7; the digit is where the count from the top reaches remaining
      uint32_t c[8], s = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) s += c[i] = sh.hist[8 * lane + i];
      uint32_t incl = s;  // keys in the bins of lanes >= l
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_down_sync(0xffffffffu, incl, o);
        if (lane + o < 32) incl += v;
      }
      uint32_t above = incl - s;
      const uint32_t want = uint32_t(remaining);
#pragma unroll
      for (int i = 7; i >= 0; --i) {
        if (above < want && above + c[i] >= want) {
          sh.digit = 8 * lane + i;
          sh.remaining = int32_t(want - above);
        }
        above += c[i];
      }
    }
    __syncthreads();
    prefix |= uint32_t(sh.digit) << shift;
    known |= 0xffu << shift;
    remaining = sh.remaining;
  }
  // Emit: every key above the threshold, and the first `remaining` equal to it, in index order.
  const uint32_t thr = prefix;
  const int32_t run = (m + kThreads - 1) / kThreads;
  const int32_t first = tid * run, last = first + run < m ? first + run : m;
  uint32_t above = 0, equal = 0;
  for (int32_t i = first; i < last; ++i) {
    const uint32_t key = keys[i];
    above += key > thr;
    equal += key == thr;
  }
  uint64_t base;
  cub::BlockScan<uint64_t, kThreads>(sh.scan).ExclusiveSum((uint64_t(above) << 32) | equal, base);
  const uint32_t equal_before = uint32_t(base & 0xffffffffu);
  const uint32_t need = uint32_t(remaining);
  int64_t w = out + int64_t(base >> 32) + (equal_before < need ? equal_before : need);
  uint32_t seen = equal_before;
  for (int32_t i = first; i < last; ++i) {
    const uint32_t key = keys[i];
    bool pick = key > thr;
    if (key == thr) pick = seen++ < need;
    if (pick) put(a, w++, i);
  }
  __syncthreads();  // sh.scan and sh.hist are reused by the next row
}

template <class T, int G>
__global__ void __launch_bounds__(kThreads) quest_select_kernel(const QuestSelectLaunch a, int32_t smem_keys) {
  extern __shared__ uint32_t skeys[];
  __shared__ SelectShared sh;
  const int32_t tid = int32_t(threadIdx.x);
  const int32_t Hkv = a.n_kv_heads, group = a.n_q_heads / Hkv;
  const int32_t b = int32_t(blockIdx.x) / Hkv, kh = int32_t(blockIdx.x) % Hkv;
  const int32_t R = a.group_max ? 1 : group;  // rows of this CTA
  const int32_t rows_per_seq = a.group_max ? Hkv : a.n_q_heads;
  const int32_t row0 = a.group_max ? kh : kh * group;
  const int32_t begin = __ldg(a.kv_indptr + b), n = __ldg(a.kv_indptr + b + 1) - begin;
  const int32_t len = row_entries(n, a.budget_pages);
  const int64_t seq_out = entries_before(a, b) * rows_per_seq;
  const int64_t out0 = seq_out + int64_t(row0) * len;
  for (int32_t i = tid; i < R; i += kThreads)
    a.sel_indptr[int64_t(b) * rows_per_seq + row0 + i] = int32_t(out0 + int64_t(i) * len);
  if (tid == 0 && b == a.batch - 1 && kh == Hkv - 1)
    a.sel_indptr[int64_t(a.batch) * rows_per_seq] = int32_t(seq_out + int64_t(rows_per_seq) * len);
  if (len == n || n <= 0) {  // no more pages than the budget: every page (the dense row)
    for (int32_t i = tid; i < R * len; i += kThreads) put(a, out0 + i, i % len);
    return;
  }
  const int32_t m = n - 1;  // the middle: every page but the last, which every row keeps
  uint32_t* keys = int64_t(R) * m <= smem_keys ? skeys
                                               : a.keys + int64_t(blockIdx.x) * R * a.max_pages;
  // Decode: the sequence's one query (check_decode_call); a sequence without one scores with q = 0.
  const int32_t q_end = __ldg(a.qo_indptr + b + 1);
  const int64_t q_row = q_end > __ldg(a.qo_indptr + b) ? int64_t(q_end) - 1 : -1;
  if constexpr (G > 0) bound_keys<T, G>(a, kh, begin, m, q_row, keys);
  else bound_keys_general<T>(a, kh, begin, m, q_row, keys);
  __syncthreads();  // keys (shared or global) are complete
  for (int32_t g = 0; g < R; ++g) select_row(a, sh, keys + int64_t(g) * m, m, len - 1, out0 + int64_t(g) * len);
}

template <class T>
cudaError_t launch_t(const QuestSelectLaunch& a, int32_t G, bool vector, dim3 grid, int32_t smem_keys,
                     cudaStream_t stream) {
  const size_t smem = size_t(smem_keys) * sizeof(uint32_t);
  if (!vector) {
    quest_select_kernel<T, 0><<<grid, kThreads, smem, stream>>>(a, smem_keys);
  } else {
    switch (G) {
      case 1: quest_select_kernel<T, 1><<<grid, kThreads, smem, stream>>>(a, smem_keys); break;
      case 2: quest_select_kernel<T, 2><<<grid, kThreads, smem, stream>>>(a, smem_keys); break;
      case 4: quest_select_kernel<T, 4><<<grid, kThreads, smem, stream>>>(a, smem_keys); break;
      case 7: quest_select_kernel<T, 7><<<grid, kThreads, smem, stream>>>(a, smem_keys); break;
      default: quest_select_kernel<T, 8><<<grid, kThreads, smem, stream>>>(a, smem_keys); break;
    }
  }
  return cudaGetLastError();
}

}  // namespace

size_t quest_select_scratch_keys(int32_t max_batch, int32_t n_q_heads, int32_t n_kv_heads, bool group_max,
                                 int32_t max_pages) noexcept {
  const int64_t rows_per_cta = group_max || n_kv_heads <= 0 ? 1 : n_q_heads / n_kv_heads;
  if (rows_per_cta * (max_pages > 1 ? max_pages - 1 : 0) <= kSmemKeys) return 0;  // shared memory holds them
  return size_t(max_batch > 0 ? max_batch : 0) * size_t(n_kv_heads) * size_t(rows_per_cta) * size_t(max_pages);
}

const char* launch_quest_select(const QuestSelectLaunch& a) noexcept {
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.n_kv_heads <= 0 || a.n_q_heads <= 0 || a.n_q_heads % a.n_kv_heads != 0)
    return "quest select: bad head counts";
  if (a.budget_pages < 1 || a.head_dim <= 0 || a.max_pages < 0) return "quest select: bad budget or shape";
  if (a.batch <= 0) {  // an empty selection still has indptr[0] = 0
    const cudaError_t e = cudaMemsetAsync(a.sel_indptr, 0, sizeof(int32_t), stream);
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
  const int64_t ctas = int64_t(a.batch) * a.n_kv_heads;
  if (ctas > INT32_MAX) return "quest select: grid too large";
  const int32_t G = a.n_q_heads / a.n_kv_heads;
  const int64_t want = int64_t(a.group_max ? 1 : G) * (a.max_pages > 1 ? a.max_pages - 1 : 0);
  const int32_t smem_keys = want <= kSmemKeys ? int32_t(want) : 0;  // else every long row uses the scratch
  const bool vector = vector_bounds_fit(a.kv_dtype, a.head_dim, a.sidecar, G);
  const dim3 grid{unsigned(ctas)};
  cudaError_t e;
  switch (a.kv_dtype) {
    case Storage::f32: e = launch_t<float>(a, G, vector, grid, smem_keys, stream); break;
    case Storage::f16: e = launch_t<__half>(a, G, vector, grid, smem_keys, stream); break;
    case Storage::bf16: e = launch_t<__nv_bfloat16>(a, G, vector, grid, smem_keys, stream); break;
    default: return "quest select: unsupported KV dtype";
  }
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::selection
