// Quest's fused CUDA select (quest_select_cuda.hpp): CTAs of 256 threads per (sequence, KV head,
// slice of its pages).
//   bounds: a half-warp per page (the slice's pages hw, hw + 16, ...), the canonical sum of
//           page_bound.hpp (page_bound_device.cuh, so the CPU's bits); page ids fetched 16 at a
//           time, each lane's chunks of the records staged by cp.async three stages deep; the order
//           key of each (row, page) into the global key scratch.
//   select: the last slice of a (sequence, KV head) to arrive, per row: the k-th best key by a
//           radix select (4 passes of 8 bits: a 256-bin shared histogram of the keys that match
//           the digits found so far, then one warp finds the bin that holds the k-th), then one
//           block scan of (above, equal to) the threshold over contiguous runs gives every thread
//           its place: keys above it, then the lowest-indexed keys equal to it — exactly the CPU's
//           (key desc, index asc) top k.
// Row offsets come from the page counts (every row holds min(pages, budget) entries), so no pass
// over the kept counts; slice 0 writes its rows' indptr. Measured against the earlier bound +
// top-k kernels in docs/bench/policy.md (issue 20).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "page_bound_device.cuh"
#include "sieve/selection/quest_select_cuda.hpp"

namespace sieve::selection {
namespace {

constexpr int kThreads = 256;
constexpr int kHalfWarps = kThreads / 16;
constexpr int kStages = 3;                  // cp.async ring: two stages in flight while one is summed
constexpr int kMinSlicePages = 256;         // pages a slice CTA takes at least (16 per half-warp)
constexpr int kCtasPerSm = 2;               // resident CTAs of this kernel per SM (registers, ring)
constexpr int kMaxSlices = 64;

struct SelectShared {
  uint32_t hist[256];
  typename cub::BlockScan<uint64_t, kThreads>::TempStorage scan;
  int32_t digit, remaining;
  bool last;
};

// The global scratch: arrival counters [max_batch * n_kv_heads] (zero between calls), then the
// keys [max_batch * n_kv_heads * rows per CTA * max_pages].
struct Scratch {
  uint32_t* arrivals;
  uint32_t* keys;
};
__host__ __device__ inline size_t counters_bytes(int64_t ctas) { return size_t((ctas * 4 + 255) / 256 * 256); }
__device__ inline Scratch scratch_of(const QuestSelectLaunch& a) {
  const int64_t ctas = int64_t(a.scratch_batch) * a.n_kv_heads;
  auto* base = static_cast<unsigned char*>(a.scratch);
  return {reinterpret_cast<uint32_t*>(base), reinterpret_cast<uint32_t*>(base + counters_bytes(ctas))};
}

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

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Order keys of middle pages [lo, hi) of sequence b for KV head kh: keys[g * m + j] for row g of
// the CTA (the group's query head g, or the group max when a.group_max). Vector path (G > 0):
// head_dim <= 128, lane p holds chunk p of the record and of the G heads' queries. Each lane
// stages its own chunks of the next pages' records in shared memory with cp.async (a ring of
// kStages x kDepth pages; a lane reads back only what it copied, so no barrier), so the loads of
// two stages stay in flight while the third is summed and no register holds them.
template <class T, int G>
__device__ void bound_keys(const QuestSelectLaunch& a, int32_t kh, int32_t begin, int32_t m, int32_t lo,
                           int32_t hi, int64_t q_row, uint32_t* keys, uint4* ring) {
  constexpr int kParts = Chunk<T>::kParts;
  constexpr int kDepth = 4 / kParts;  // pages per stage: 2 KB of 16-bit records per half-warp
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
  // The half-warp's pages: item i is middle page lo + hw + kHalfWarps * i.
  const int32_t n_items = hi - lo > hw ? (hi - lo - hw + kHalfWarps - 1) / kHalfWarps : 0;
  auto page_of = [&](int32_t i) { return lo + hw + kHalfWarps * i; };
  // Physical ids 16 items at a time (lane l holds item 16 g + l's), the next group's fetched early.
  auto fetch_ids = [&](int32_t grp) {
    const int32_t i = grp * kBoundPartials + p;
    return i < n_items ? __ldg(a.kv_indices + begin + page_of(i)) : 0;
  };
  int32_t ids = fetch_ids(0), ids_next = fetch_ids(1), issued = 0;
  auto slot = [&](int st, int u, int half, int part) {
    return ring + ((((st * kDepth + u) * 2 + half) * kParts + part) * kThreads + tid);
  };
  auto issue = [&](int st) {  // the next kDepth items into stage st, as one commit group
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int32_t i = issued + u;
      if (i < n_items) {
        if (i > 0 && i % kBoundPartials == 0) {
          ids = ids_next;
          ids_next = fetch_ids(i / kBoundPartials + 1);
        }
        const int64_t phys = __shfl_sync(mask, ids, i % kBoundPartials, 16);
        if (has) {
          const T* rec = side + phys * page_elems;
#pragma unroll
          for (int part = 0; part < kParts; ++part) {
            cp_async16(slot(st, u, 0, part), reinterpret_cast<const uint4*>(rec) + part);
            cp_async16(slot(st, u, 1, part), reinterpret_cast<const uint4*>(rec + d) + part);
          }
        }
      }
    }
    issued += kDepth;
    cp_async_commit();  // empty groups past the end keep the wait counts uniform
  };
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
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue(st);
  for (int32_t c = 0; c * kDepth < n_items; ++c) {
    issue((c + kStages - 1) % kStages);
    cp_async_wait<kStages - 1>();  // this lane's copies of stage c % kStages landed
    const int st = c % kStages;
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int32_t i = c * kDepth + u;
      if (i >= n_items) break;
      Chunk<T> mn, mx;
      if (has) {
#pragma unroll
        for (int part = 0; part < kParts; ++part) {
          mn.set(part, *slot(st, u, 0, part));
          mx.set(part, *slot(st, u, 1, part));
        }
      }
      score(page_of(i), mn, mx);
    }
  }
  cp_async_wait<0>();
}

// The cp.async ring: kDepth * kParts = 4 pieces of 16 B per record half, per stage and thread.
constexpr size_t kRingBytes = size_t(kStages) * 4 * 2 * kThreads * 16;

// Any head_dim, group size and alignment: the same sums element by element (G == 0).
template <class T>
__device__ void bound_keys_general(const QuestSelectLaunch& a, int32_t kh, int32_t begin, int32_t m,
                                   int32_t lo, int32_t hi, int64_t q_row, uint32_t* keys) {
  const int32_t tid = int32_t(threadIdx.x), hw = tid >> 4, p = tid & 15;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim, G = a.n_q_heads / Hkv;
  const T* side = static_cast<const T*>(a.sidecar);
  for (int32_t j = lo + hw; j < hi; j += kHalfWarps) {
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
// out, then the last page n - 1 = m at out + k. Every thread calls it; ends with a barrier. Keys
// in global memory (`global`) were written by other CTAs: read through L2 (__ldcg), never a stale
// L1 line; in shared memory, plainly.
__device__ void select_row(const QuestSelectLaunch& a, SelectShared& sh, const uint32_t* keys, bool global,
                           int32_t m, int32_t k, int64_t out) {
  auto key_at = [&](int32_t j) { return global ? __ldcg(keys + j) : keys[j]; };
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
      const uint32_t key = key_at(j);
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
    const uint32_t key = key_at(i);
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
    const uint32_t key = key_at(i);
    bool pick = key > thr;
    if (key == thr) pick = seen++ < need;
    if (pick) put(a, w++, i);
  }
  __syncthreads();  // sh.scan and sh.hist are reused by the next row
}

// Grid: (sequence, KV head, slice). Every slice CTA scores pages [lo, hi) of the middle into the
// global keys; the last of a (sequence, KV head)'s slices to arrive (an atomic counter, reset by
// that CTA for the next call) runs the rows' selects. Slice 0 writes the rows' indptr, and the
// pages of dense rows.
template <class T, int G>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) quest_select_kernel(const QuestSelectLaunch a, int32_t slices) {
  extern __shared__ uint4 ring[];
  __shared__ SelectShared sh;
  const int32_t tid = int32_t(threadIdx.x);
  const int32_t Hkv = a.n_kv_heads, group = a.n_q_heads / Hkv;
  const int32_t unit = int32_t(blockIdx.x) / slices, slice = int32_t(blockIdx.x) % slices;
  const int32_t b = unit / Hkv, kh = unit % Hkv;
  const int32_t R = a.group_max ? 1 : group;  // rows of this (sequence, KV head)
  const int32_t rows_per_seq = a.group_max ? Hkv : a.n_q_heads;
  const int32_t row0 = a.group_max ? kh : kh * group;
  const int32_t begin = __ldg(a.kv_indptr + b), n = __ldg(a.kv_indptr + b + 1) - begin;
  const int32_t len = row_entries(n, a.budget_pages);
  const int64_t seq_out = entries_before(a, b) * rows_per_seq;
  const int64_t out0 = seq_out + int64_t(row0) * len;
  const bool dense = len == n || n <= 0;  // no more pages than the budget: every page
  if (slice == 0) {
    for (int32_t i = tid; i < R; i += kThreads)
      a.sel_indptr[int64_t(b) * rows_per_seq + row0 + i] = int32_t(out0 + int64_t(i) * len);
    if (tid == 0 && b == a.batch - 1 && kh == Hkv - 1)
      a.sel_indptr[int64_t(a.batch) * rows_per_seq] = int32_t(seq_out + int64_t(rows_per_seq) * len);
    if (dense)
      for (int32_t i = tid; i < R * len; i += kThreads) put(a, out0 + i, i % len);
  }
  if (dense) return;
  const int32_t m = n - 1;  // the middle: every page but the last, which every row keeps
  const int32_t per = (m + slices - 1) / slices;
  const int32_t lo = min(m, slice * per), hi = min(m, lo + per);
  const Scratch sc = scratch_of(a);
  uint32_t* keys = sc.keys + int64_t(unit) * R * a.max_pages;
  // Decode: the sequence's one query (check_decode_call); a sequence without one scores with q = 0.
  const int32_t q_end = __ldg(a.qo_indptr + b + 1);
  const int64_t q_row = q_end > __ldg(a.qo_indptr + b) ? int64_t(q_end) - 1 : -1;
  if constexpr (G > 0) bound_keys<T, G>(a, kh, begin, m, lo, hi, q_row, keys, ring);
  else bound_keys_general<T>(a, kh, begin, m, lo, hi, q_row, keys);
  if (slices > 1) {
    __threadfence();  // this CTA's keys are visible device-wide before it counts itself in
    __syncthreads();
    if (tid == 0) {
      const uint32_t before = atomicInc(sc.arrivals + unit, uint32_t(slices - 1));  // wraps to 0
      sh.last = before == uint32_t(slices - 1);
    }
    __syncthreads();
    if (!sh.last) return;
    __threadfence();  // the other slices' keys (they fenced before counting) are read after this
  } else {
    __syncthreads();  // keys are complete
  }
  // Each row's keys into shared memory first (the ring is free now): one pass of independent L2
  // reads, 8 in flight per thread, instead of six passes of dependent ones (the radix select's
  // and the emit's), which cost ~25 us at batch 16 x 32K. Rows longer than the ring stay in L2.
  uint32_t* sk = reinterpret_cast<uint32_t*>(ring);
  const int32_t cap = G > 0 ? int32_t(kRingBytes / sizeof(uint32_t)) : 0;
  for (int32_t g = 0; g < R; ++g) {
    const uint32_t* row = keys + int64_t(g) * m;
    const bool staged = m <= cap;
    if (staged) {
      constexpr int kBatch = 8;
      for (int32_t j0 = 0; j0 < m; j0 += kBatch * kThreads) {
        uint32_t v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int32_t j = j0 + u * kThreads + tid;
          v[u] = j < m ? __ldcg(row + j) : 0u;
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int32_t j = j0 + u * kThreads + tid;
          if (j < m) sk[j] = v[u];
        }
      }
      __syncthreads();
    }
    select_row(a, sh, staged ? sk : row, !staged, m, len - 1, out0 + int64_t(g) * len);
  }
}

template <class T>
cudaError_t launch_t(const QuestSelectLaunch& a, int32_t G, bool vector, dim3 grid, int32_t slices,
                     cudaStream_t stream) {
  if (!vector) {
    quest_select_kernel<T, 0><<<grid, kThreads, 0, stream>>>(a, slices);
    return cudaGetLastError();
  }
  constexpr size_t smem = kRingBytes;
  static unsigned long long raised = 0;  // devices whose dynamic shared-memory limit is raised
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
  if (!bit || !(__atomic_load_n(&raised, __ATOMIC_ACQUIRE) & bit)) {
    for (const void* f : {reinterpret_cast<const void*>(quest_select_kernel<T, 1>), reinterpret_cast<const void*>(quest_select_kernel<T, 2>),
                          reinterpret_cast<const void*>(quest_select_kernel<T, 4>), reinterpret_cast<const void*>(quest_select_kernel<T, 7>),
                          reinterpret_cast<const void*>(quest_select_kernel<T, 8>)})
      if (cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)); e != cudaSuccess)
        return e;
    __atomic_fetch_or(&raised, bit, __ATOMIC_ACQ_REL);
  }
  switch (G) {
    case 1: quest_select_kernel<T, 1><<<grid, kThreads, smem, stream>>>(a, slices); break;
    case 2: quest_select_kernel<T, 2><<<grid, kThreads, smem, stream>>>(a, slices); break;
    case 4: quest_select_kernel<T, 4><<<grid, kThreads, smem, stream>>>(a, slices); break;
    case 7: quest_select_kernel<T, 7><<<grid, kThreads, smem, stream>>>(a, slices); break;
    default: quest_select_kernel<T, 8><<<grid, kThreads, smem, stream>>>(a, slices); break;
  }
  return cudaGetLastError();
}

// Multiprocessors of the current device, read once per device.
int sm_count() {
  static int counts[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (counts[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    counts[dev] = n;
  }
  return counts[dev];
}

}  // namespace

size_t quest_select_scratch_bytes(int32_t max_batch, int32_t n_q_heads, int32_t n_kv_heads, bool group_max,
                                  int32_t max_pages) noexcept {
  if (max_batch <= 0 || n_kv_heads <= 0 || max_pages <= 0) return 256;
  const int64_t rows_per_cta = group_max ? 1 : n_q_heads / n_kv_heads;
  const int64_t ctas = int64_t(max_batch) * n_kv_heads;
  return counters_bytes(ctas) + size_t(ctas) * size_t(rows_per_cta) * size_t(max_pages) * sizeof(uint32_t);
}

const char* quest_select_scratch_init(void* scratch, size_t bytes, void* stream) noexcept {
  // Synchronised (a create-time call): the zeros are in place whatever stream the calls use.
  auto st = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemsetAsync(scratch, 0, bytes, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* launch_quest_select(const QuestSelectLaunch& a) noexcept {
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.n_kv_heads <= 0 || a.n_q_heads <= 0 || a.n_q_heads % a.n_kv_heads != 0)
    return "quest select: bad head counts";
  if (a.budget_pages < 1 || a.head_dim <= 0 || a.max_pages < 0) return "quest select: bad budget or shape";
  if (a.batch > a.scratch_batch) return "quest select: more sequences than the scratch was sized for";
  if (a.batch <= 0) {  // an empty selection still has indptr[0] = 0
    const cudaError_t e = cudaMemsetAsync(a.sel_indptr, 0, sizeof(int32_t), stream);
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
  const int64_t units = int64_t(a.batch) * a.n_kv_heads;
  // Slices per (sequence, KV head): enough CTAs for every SM's resident pair, none shorter than
  // kMinSlicePages (at batch 16 x 8 KV heads: 2; at batch 1, 32K: 8).
  const int64_t resident = int64_t(kCtasPerSm) * sm_count();
  const int64_t by_pages = (int64_t(a.max_pages) + kMinSlicePages - 1) / kMinSlicePages;
  int64_t slices = resident / units;
  slices = slices < 1 ? 1 : slices > by_pages ? by_pages : slices;
  if (slices > kMaxSlices) slices = kMaxSlices;
  if (slices < 1) slices = 1;
  if (units * slices > INT32_MAX) return "quest select: grid too large";
  const int32_t G = a.n_q_heads / a.n_kv_heads;
  const bool vector = vector_bounds_fit(a.kv_dtype, a.head_dim, a.sidecar, G);
  const dim3 grid{unsigned(units * slices)};
  cudaError_t e;
  switch (a.kv_dtype) {
    case Storage::f32: e = launch_t<float>(a, G, vector, grid, int32_t(slices), stream); break;
    case Storage::f16: e = launch_t<__half>(a, G, vector, grid, int32_t(slices), stream); break;
    case Storage::bf16: e = launch_t<__nv_bfloat16>(a, G, vector, grid, int32_t(slices), stream); break;
    default: return "quest select: unsupported KV dtype";
  }
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::selection
