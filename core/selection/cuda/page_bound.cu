// CUDA half of page_bound.hpp.
//   minmax_append: block (touched page t, sequence b); threads over (KV head, channel). The page's
//                  new tokens are read back from the store's pages; the first token of a page
//                  initialises it, later appends fold into the stored min/max (as the CPU).
//   page_bounds:   a half-warp per (sequence, page, KV head); lane p sums chunk p (8 channels,
//                  one 16-byte piece), then a butterfly — the canonical order of page_bound.hpp,
//                  so the CPU's bits. The vector kernel walks many pages per half-warp (one wave
//                  of blocks), streams the records through a per-lane cp.async ring in shared
//                  memory and sums the group's heads' butterflies as one reduce-scatter.
// Templated on the KV storage type only (3 instantiations each); q's dtype is a runtime switch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "sieve/selection/page_bound.hpp"
#include "sieve/selection/page_bound_cuda.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::selection {
namespace {

constexpr int kAppendThreads = 256;


template <class T>
__global__ void __launch_bounds__(kAppendThreads) minmax_append(MinMaxAppendLaunch a) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t ps = a.page_size, d = a.head_dim, H = a.n_kv_heads;
  const int32_t n_pages = a.kv_indptr[b + 1] - a.kv_indptr[b];
  if (n_pages <= 0) return;
  const int64_t len = int64_t(n_pages - 1) * ps + a.last_page_len[b];
  // No new_indptr: recompute the whole sequence (catch-up).
  const int64_t n_new = a.new_indptr ? a.new_indptr[b + 1] - a.new_indptr[b] : len;
  if (n_new <= 0 || n_new > len) return;
  const int64_t first = len - n_new;
  const int64_t logical = first / ps + blockIdx.x;
  if (logical * ps >= len) return;
  const int64_t start = first > logical * ps ? first : logical * ps;
  const int64_t end = len < (logical + 1) * ps ? len : (logical + 1) * ps;
  const int32_t offset = int32_t(start - logical * ps), stop = int32_t(end - logical * ps);
  const int64_t phys = a.kv_indices[a.kv_indptr[b] + logical];
  const T* k = static_cast<const T*>(a.k_pages);
  T* side = static_cast<T*>(a.sidecar);
  for (int32_t i = int32_t(threadIdx.x); i < H * d; i += kAppendThreads) {
    const int32_t h = i / d, c = i % d;
    const int64_t kbase = a.k_strides.row(phys, h, 0) + c;
    const int64_t sbase = (phys * H + h) * 2 * d + c;
    int32_t t = offset;
    float mn, mx;
    if (offset == 0) {
      mn = mx = to_f32(k[kbase]);
      ++t;
    } else {
      mn = to_f32(side[sbase]);
      mx = to_f32(side[sbase + d]);
    }
    for (; t < stop; ++t) {
      const float v = to_f32(k[kbase + int64_t(t) * a.k_strides.token]);
      mn = fminf(mn, v);
      mx = fmaxf(mx, v);
    }
    side[sbase] = from_f32<T>(mn);
    side[sbase + d] = from_f32<T>(mx);
  }
}

// ---- page bounds ------------------------------------------------------------------------
// A half-warp per (page, KV head): lane p holds partial p of the canonical sum (page_bound.hpp),
// i.e. the channels of chunks p, p + 16, ...; the 16 partials combine by the canonical butterfly
// of xor shuffles inside the half-warp. A block is 16 half-warps laid out [page slot][KV head of
// the tile], so a page's KV heads — adjacent in the sidecar — are read by adjacent half-warps.
// The fast kernel (head_dim <= 128, a multiple of 8, 16-byte aligned sidecar, G in {1, 2, 4, 7,
// 8}) copies a (page, KV head)'s min and max 16 bytes a lane (32 for f32) and keeps the
// lane's q channels of the group's G heads in registers; the general kernel reads element by
// element, in the same order. G = 7 is Qwen2-7B's 28 q / 4 KV heads (the general kernel made
// Quest slower than dense there).
constexpr int kBoundThreads = 256;
constexpr int kHalfWarps = kBoundThreads / 16;

struct BoundTiling {
  int32_t kv_tile;  // KV heads per block (a block covers kv_tile heads of `slots` pages at a time)
  int32_t slots;    // page slots per block
};

__device__ __forceinline__ int64_t last_query_row(const PageBoundLaunch& a, int32_t b) {
  const int64_t row = int64_t(a.qo_indptr[b + 1]) - 1;
  return row < a.qo_indptr[b] ? -1 : row;
}

__device__ __forceinline__ void write_bound(const PageBoundLaunch& a, int64_t item, int32_t head, float v) {
  a.scores[item * a.layout.item_stride + int64_t(head) * a.layout.head_stride] = v;
}

// The 16 partials of a half-warp, summed by the canonical butterfly (every lane gets the total).
__device__ __forceinline__ float half_warp_sum(float acc, unsigned mask) {
#pragma unroll
  for (int off = kBoundPartials / 2; off > 0; off >>= 1)
    acc = add_rn(acc, __shfl_xor_sync(mask, acc, off));
  return acc;
}

// The canonical butterfly of N heads' partials at once, as a reduce-scatter: at each level with
// more than one head left, a lane keeps half of its heads and adds its partner's partials of
// them, sending the other half — so N heads take N - 1 + log2(16 / N) shuffles instead of 4 N.
// Each addition is the canonical one (partial i + partial i + Off: float addition commutes, so
// either lane's order gives its bits). Lane p holds head j ^ hx in slot j, hx = p / (16 / N): the
// head it keeps is then always in the lower slots and the one it sends in the upper ones (its
// partner's slots are permuted by the opposite bit), so no lane selects; afterwards lane p holds
// the total of head hx.
template <int N, int Off = kBoundPartials / 2>
__device__ __forceinline__ float reduce_scatter(const float (&v)[N], unsigned mask) {
  static_assert(N >= 1 && N <= kBoundPartials && (N & (N - 1)) == 0, "a power of two up to 16 heads");
  constexpr int M = N > 1 ? N / 2 : 1;
  float rest[M];
#pragma unroll
  for (int i = 0; i < M; ++i) rest[i] = add_rn(v[i], __shfl_xor_sync(mask, v[i + N - M], Off));
  if constexpr (Off > 1) return reduce_scatter<M, Off / 2>(rest, mask);
  else return rest[0];
}

// reduce_scatter of the slots head(0) ... head(N - 1), each made only when the first level needs
// it (slots i and i + N / 2 together), so that half of them are live at a time.
template <int N, class Head>
__device__ __forceinline__ float reduce_scatter_heads(Head head, unsigned mask) {
  constexpr int Off = kBoundPartials / 2, M = N > 1 ? N / 2 : 1;
  float rest[M];
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const float keep = head(i);
    rest[i] = add_rn(keep, __shfl_xor_sync(mask, N > 1 ? head(i + M) : keep, Off));
  }
  if constexpr (Off > 1) return reduce_scatter<M, Off / 2>(rest, mask);
  else return rest[0];
}

// A lane's 8 channels of q at element i (i a multiple of 8): two 16-byte loads for f32, one for
// f16 / bf16, where q is 16-byte aligned (its rows are: head_dim is a multiple of 8 here).
__device__ __forceinline__ void load_q_chunk(const void* q, Storage s, int64_t i, float (&out)[kBoundChunk]) {
  if ((reinterpret_cast<uintptr_t>(q) & 15u) != 0) {
#pragma unroll
    for (int c = 0; c < kBoundChunk; ++c) out[c] = load_storage(q, s, i + c);
  } else if (s == Storage::f32) {
    const float4 lo = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(q) + i));
    const float4 hi = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(q) + i) + 1);
    const float v[kBoundChunk] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int c = 0; c < kBoundChunk; ++c) out[c] = v[c];
  } else {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(q) + i));
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    const bool bf = s == Storage::bf16;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = bf ? __uint_as_float(w[k] << 16) : __half2float(__ushort_as_half(uint16_t(w[k] & 0xffffu)));
      out[2 * k + 1] = bf ? __uint_as_float(w[k] & 0xffff0000u) : __half2float(__ushort_as_half(uint16_t(w[k] >> 16)));
    }
  }
}

// 8 channels of one chunk (min or max), as copied: 16 bytes (32 for f32).
template <class T>
struct Chunk {  // __half, __nv_bfloat16: channel 2w in the low half of word w, 2w + 1 in the high
  uint4 raw;
  __device__ __forceinline__ uint32_t word(int w) const {
    return w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
  }
};
template <>
struct Chunk<float> {
  float4 lo, hi;
  __device__ __forceinline__ void load_words(uint4 a, uint4 b) {
    lo = make_float4(__uint_as_float(a.x), __uint_as_float(a.y), __uint_as_float(a.z), __uint_as_float(a.w));
    hi = make_float4(__uint_as_float(b.x), __uint_as_float(b.y), __uint_as_float(b.z), __uint_as_float(b.w));
  }
  __device__ __forceinline__ float at(int i) const {
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    return v[i];
  }
};

// The selected (min or max, by q's sign) 16-bit values of a word's two channels as floats.
__device__ __forceinline__ float low_f32(uint32_t w, __nv_bfloat16*) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float high_f32(uint32_t w, __nv_bfloat16*) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float low_f32(uint32_t w, __half*) { return __half2float(__ushort_as_half(uint16_t(w & 0xffffu))); }
__device__ __forceinline__ float high_f32(uint32_t w, __half*) { return __half2float(__ushort_as_half(uint16_t(w >> 16))); }

// The q-sign selection of a 16-bit chunk, precomputed per (head, word): __byte_perm(min word,
// max word, selector) takes each channel's 2 bytes from max where q >= 0, else from min — the
// operand bound_step picks, without a compare per term.
__device__ __forceinline__ uint32_t sign_selector(float q_even, float q_odd) {
  const uint32_t e = q_even >= 0.0f ? 0x54u : 0x10u, o = q_odd >= 0.0f ? 0x76u : 0x32u;
  return e | (o << 8);
}

// Sum of a lane's 8 channels for one head, from 0, in channel order (bound_step).
template <class T>
__device__ __forceinline__ float chunk_sum(const float (&q)[kBoundChunk], const uint32_t (&sel)[kBoundChunk / 2],
                                           const Chunk<T>& mn, const Chunk<T>& mx) {
  float acc = 0.f;
#pragma unroll
  for (int w = 0; w < kBoundChunk / 2; ++w) {
    const uint32_t v = __byte_perm(mn.word(w), mx.word(w), sel[w]);
    acc = __fmaf_rn(q[2 * w], low_f32(v, static_cast<T*>(nullptr)), acc);
    acc = __fmaf_rn(q[2 * w + 1], high_f32(v, static_cast<T*>(nullptr)), acc);
  }
  return acc;
}
template <>
__device__ __forceinline__ float chunk_sum<float>(const float (&q)[kBoundChunk], const uint32_t (&)[kBoundChunk / 2],
                                                  const Chunk<float>& mn, const Chunk<float>& mx) {
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kBoundChunk; ++i) acc = bound_step(acc, q[i], mn.at(i), mx.at(i));
  return acc;
}

// A (page, KV head)'s record as one lane holds it: its chunk of the min and of the max.
template <class T>
struct Record {
  Chunk<T> mn, mx;
};

// 16-byte copies of a chunk: one for a 16-bit sidecar, two for f32.
template <class T>
constexpr int kChunkVecs = sizeof(T) == 4 ? 2 : 1;

// How the fast kernel walks a half-warp's pages, by storage type and group size: kStep pages are
// summed together (G = 1, 2: more independent chains for the scheduler; from G = 4 the heads are
// enough, and two pages would spill at 80 registers), and the records of the next kRing - 1 steps
// are in flight meanwhile — staged in shared memory by cp.async, so that the bytes in flight cost
// no registers (the G heads' q, 8 floats a head, and their sign selectors hold most of them).
// kRing fills 48 KB of static shared memory per block: 5 pages (160 bytes) a lane in flight for
// 16-bit records from G = 4.
template <class T, int G>
struct BoundWalk {
  static constexpr int kStep = (sizeof(T) == 4 || G >= 4) ? 1 : 2;
  static constexpr int kRing = 6 / (kStep * kChunkVecs<T>);
  // Blocks an SM holds (the launch bound): as many as the registers allow without spilling
  // (ptxas -v: G <= 2 fit 64 registers a thread, G = 4 fits 80, G = 7 and 8 need 128); the
  // 48 KB ring of each fits beside the others.
  static constexpr int kBlocksPerSm = G >= 7 ? 2 : G == 4 ? 3 : 4;
};

template <int G>
__host__ __device__ constexpr int pow2_at_least() {
  int n = 1;
  while (n < G) n *= 2;
  return n;
}

// 16-byte global -> shared copies (sm_80+). Unlike attention_mma.cuh's, these clobber memory:
// the ring is read right after a wait, with no barrier that would stop the compiler from
// hoisting the reads above it.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// The half-warp's pages are first, first + stride, ... (k-th: first + k * stride); lane p keeps
// the physical ids of the 16 pages of the current group (k in [16 c, 16 c + 16)) and of the next,
// so a record's copy waits on a shuffle, not on a global read. Each lane copies its own 16-byte
// pieces of the next kRing - 1 steps into its own slots of a shared-memory ring (cp.async) and
// reads back only those, so no lane waits for another; the partials of a step's pages then
// reduce-scatter over the group's heads (slot j of lane p is head j ^ p / (16 / N)), and the
// owner lanes write (group max: lane 0 takes the heads in order, as the CPU).
template <class T, int G, bool kGroupMax>
__global__ void __launch_bounds__(kBoundThreads, (BoundWalk<T, G>::kBlocksPerSm)) page_bounds_fast(PageBoundLaunch a, BoundTiling t) {
  using Walk = BoundWalk<T, G>;
  constexpr int S = Walk::kStep, R = Walk::kRing, V = kChunkVecs<T>, N = pow2_at_least<G>();
  constexpr int kLanesPerHead = kBoundPartials / N;
  // [warp][stage][page of the step][min, max][16-byte piece][lane]: a warp's loads of one piece
  // are 512 contiguous bytes (no bank conflicts).
  __shared__ uint4 ring[kBoundThreads / 32][R][S][2][V][32];
  const int32_t b = int32_t(blockIdx.y);
  const int32_t hw = int32_t(threadIdx.x) >> 4, p = int32_t(threadIdx.x) & 15;
  const int32_t warp = int32_t(threadIdx.x) >> 5, lane = int32_t(threadIdx.x) & 31;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int32_t slot = hw / t.kv_tile;
  const int32_t kh = int32_t(blockIdx.z) * t.kv_tile + hw % t.kv_tile;
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim;
  if (slot >= t.slots || kh >= Hkv) return;  // whole half-warps leave together
  const int64_t q_row = last_query_row(a, b);
  if (q_row < 0) return;
  const int32_t begin = a.kv_indptr[b], n_pages = a.kv_indptr[b + 1] - begin;
  const int32_t first = int32_t(blockIdx.x) * t.slots + slot, stride = int32_t(gridDim.x) * t.slots;
  if (first >= n_pages) return;
  const int32_t count = (n_pages - first + stride - 1) / stride;  // this half-warp's pages
  const int32_t steps = (count + S - 1) / S;
  const int32_t* ids = a.kv_indices + begin + first;
  auto id_of = [&](int32_t k) { return k < count ? ids[int64_t(k) * stride] : 0; };
  int32_t ids_now = id_of(p), ids_next = id_of(kBoundPartials + p);
  // Lanes past head_dim hold an empty partial: q = 0 and a zero record (never copied) sum to +0.
  const bool has = p * kBoundChunk < d;
  const T* side = static_cast<const T*>(a.sidecar) + int64_t(kh) * 2 * d + p * kBoundChunk;
  const uint32_t page_elems = uint32_t(Hkv * 2 * d);
  auto issue = [&](int32_t s, int32_t stage) {  // step s's pieces into `stage`, then one commit group
    if (s > 0 && (s * S) % kBoundPartials == 0) {  // its pages start the next id group
      ids_now = ids_next;
      ids_next = id_of(s * S + kBoundPartials + p);
    }
#pragma unroll
    for (int i = 0; i < S; ++i) {
      const int32_t k = s * S + i;
      const int32_t phys = __shfl_sync(mask, ids_now, k & (kBoundPartials - 1), 16);
      if (has && k < count) {
        const T* rec = side + uint64_t(uint32_t(phys)) * page_elems;  // ids are >= 0
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int v = 0; v < V; ++v)
            cp_async16(&ring[warp][stage][i][m][v][lane], rec + m * d + v * (16 / int(sizeof(T))));
      }
    }
    cp_async_commit();
  };
  // Start the copies first: the q prologue below overlaps their latency.
#pragma unroll
  for (int s = 0; s < R - 1; ++s) issue(s, s);
  if (!has) {
#pragma unroll
    for (int s = 0; s < R; ++s)
#pragma unroll
      for (int i = 0; i < S; ++i)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int v = 0; v < V; ++v) ring[warp][s][i][m][v][lane] = make_uint4(0u, 0u, 0u, 0u);
  }
  // Slot j holds head j ^ hx of the group (heads past G, the 8th of G = 7, hold q = 0: they sum
  // zeros, or NaN against an infinite record, and only ever meet themselves).
  const int32_t hx = p / kLanesPerHead;
  float qr[N][kBoundChunk];
  uint32_t sel[N][kBoundChunk / 2];
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int32_t g = j ^ hx;
    if (has && g < G) {
      load_q_chunk(a.q, a.q_dtype, (q_row * a.n_q_heads + kh * G + g) * d + p * kBoundChunk, qr[j]);
    } else {
#pragma unroll
      for (int i = 0; i < kBoundChunk; ++i) qr[j][i] = 0.f;
    }
#pragma unroll
    for (int w = 0; w < kBoundChunk / 2; ++w) {
      sel[j][w] = sign_selector(qr[j][2 * w], qr[j][2 * w + 1]);
      // Opaque to the compiler: left visible, it recomputes the selectors from q inside the page
      // loop (5 instructions each, 16 a page for G = 4) rather than keep them in registers.
      asm volatile("" : "+r"(sel[j][w]));
    }
  }
  // This lane's score: its group's (lane 0) or its head's (the first lane of each head).
  const bool writes = kGroupMax ? p == 0 : (p % kLanesPerHead == 0 && hx < G);
  const int32_t out_head = kGroupMax ? kh : kh * G + hx;

  int32_t read_stage = 0;
  for (int32_t s = 0; s < steps; ++s) {
    // Into the stage step s - 1 was read from (its values are used by now).
    issue(s + R - 1, read_stage == 0 ? R - 1 : read_stage - 1);
    cp_async_wait<R - 1>();
    float tot[S];
#pragma unroll
    for (int i = 0; i < S; ++i) {
      Record<T> r;
      if constexpr (V == 1) {
        r.mn.raw = ring[warp][read_stage][i][0][0][lane];
        r.mx.raw = ring[warp][read_stage][i][1][0][lane];
      } else {
        const uint4 m0 = ring[warp][read_stage][i][0][0][lane], m1 = ring[warp][read_stage][i][0][1][lane];
        const uint4 x0 = ring[warp][read_stage][i][1][0][lane], x1 = ring[warp][read_stage][i][1][1][lane];
        r.mn.load_words(m0, m1);
        r.mx.load_words(x0, x1);
      }
      tot[i] = reduce_scatter_heads<N>([&](int j) { return chunk_sum<T>(qr[j], sel[j], r.mn, r.mx); }, mask);
    }
    read_stage = read_stage == R - 1 ? 0 : read_stage + 1;
#pragma unroll
    for (int i = 0; i < S; ++i) {
      float v = tot[i];
      if constexpr (kGroupMax) {
#pragma unroll
        for (int g = 1; g < G; ++g)  // lane 0 holds head 0
          v = group_max_step(v, __shfl_sync(mask, tot[i], g * kLanesPerHead, 16), false);
      }
      const int32_t k = s * S + i;
      if (writes && k < count) write_bound(a, int64_t(begin) + first + int64_t(k) * stride, out_head, v);
    }
  }
  cp_async_wait<0>();  // no copy outlives the block
}

// Any head_dim, any group size, any alignment: the same sums, element by element.
template <class T>
__global__ void __launch_bounds__(kBoundThreads) page_bounds_general(PageBoundLaunch a, BoundTiling t) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t hw = int32_t(threadIdx.x) >> 4, p = int32_t(threadIdx.x) & 15;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int32_t slot = hw / t.kv_tile;
  const int32_t kh = int32_t(blockIdx.z) * t.kv_tile + hw % t.kv_tile;
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim, G = a.n_q_heads / a.n_kv_heads;
  if (slot >= t.slots || kh >= Hkv) return;
  const int64_t q_row = last_query_row(a, b);
  if (q_row < 0) return;
  const int32_t begin = a.kv_indptr[b], n_pages = a.kv_indptr[b + 1] - begin;
  const T* side = static_cast<const T*>(a.sidecar);
  for (int32_t j = int32_t(blockIdx.x) * t.slots + slot; j < n_pages; j += int32_t(gridDim.x) * t.slots) {
    const int64_t item = int64_t(begin) + j;
    const T* mm = side + (int64_t(a.kv_indices[item]) * Hkv + kh) * 2 * d;
    float best = 0.f;
    for (int32_t g = 0; g < G; ++g) {
      const int32_t h = kh * G + g;
      const int64_t qbase = (q_row * a.n_q_heads + h) * d;
      float acc = 0.f;
      for (int32_t chunk = p; chunk * kBoundChunk < d; chunk += kBoundPartials)
        for (int32_t c = chunk * kBoundChunk; c < d && c < (chunk + 1) * kBoundChunk; ++c)
          acc = bound_step(acc, load_storage(a.q, a.q_dtype, qbase + c), to_f32(mm[c]), to_f32(mm[d + c]));
      acc = half_warp_sum(acc, mask);
      if (a.group_max) best = group_max_step(best, acc, g == 0);
      else if (p == 0) write_bound(a, item, h, acc);
    }
    if (a.group_max && p == 0) write_bound(a, item, kh, best);
  }
}

const char* last_launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// The current device's SM count, read once per device; 0 where it cannot be read (the caller
// then sizes its grid without it).
int32_t device_sm_count() {
  constexpr int kDevices = 64;
  static std::atomic<int32_t> cached[kDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kDevices) {
    (void)cudaGetLastError();
    return 0;
  }
  int32_t n = cached[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
      (void)cudaGetLastError();
      return 0;
    }
    cached[dev].store(n = v, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace

const char* launch_minmax_append(const MinMaxAppendLaunch& a) noexcept {
  if (a.batch <= 0 || a.max_pages_touched <= 0) return nullptr;
  const dim3 grid(unsigned(a.max_pages_touched), unsigned(a.batch));
  auto stream = static_cast<cudaStream_t>(a.stream);
  dispatch_cuda_storage(a.kv_dtype, [&](auto t) {
    minmax_append<typename decltype(t)::type><<<grid, kAppendThreads, 0, stream>>>(a);
  });
  return last_launch_error();
}

const char* launch_page_bounds(const PageBoundLaunch& a) noexcept {
  if (a.batch <= 0 || a.max_pages <= 0) return nullptr;
  if (a.n_kv_heads <= 0 || a.n_q_heads % a.n_kv_heads != 0) return "page bounds: bad head counts";
  const int32_t G = a.n_q_heads / a.n_kv_heads;
  BoundTiling t{};
  t.kv_tile = a.n_kv_heads < kHalfWarps ? a.n_kv_heads : kHalfWarps;
  t.slots = kHalfWarps / t.kv_tile;
  const int64_t z = (int64_t(a.n_kv_heads) + t.kv_tile - 1) / t.kv_tile;
  const int64_t slot_groups = (int64_t(a.max_pages) + t.slots - 1) / t.slots;
  if (z > 65535 || a.batch > 65535) return "page bounds: grid too large";
  auto stream = static_cast<cudaStream_t>(a.stream);
  const size_t eb = size_t(storage_bytes(a.kv_dtype));
  const bool fast = a.head_dim > 0 && a.head_dim <= kBoundChunk * kBoundPartials &&
                    a.head_dim % kBoundChunk == 0 &&
                    reinterpret_cast<uintptr_t>(a.sidecar) % 16 == 0 &&
                    (size_t(a.head_dim) * eb) % 16 == 0 && (G == 1 || G == 2 || G == 4 || G == 7 || G == 8);
  // The general kernel: about 16 pages per half-warp, at least ~4 blocks per SM of an H100 in all.
  int64_t x = (slot_groups + kBoundPartials - 1) / kBoundPartials;
  const int64_t min_blocks = 528;
  if (x * a.batch * z < min_blocks) x = (min_blocks + a.batch * z - 1) / (a.batch * z);
  if (a.page_blocks > 0) x = a.page_blocks;
  const int32_t sms = fast && a.page_blocks <= 0 ? device_sm_count() : 0;
  const char* error = nullptr;
  dispatch_cuda_storage(a.kv_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (!fast) {
      if (x > slot_groups) x = slot_groups;
      if (x > INT32_MAX) error = "page bounds: grid too large";
      else page_bounds_general<T><<<dim3(unsigned(x), unsigned(a.batch), unsigned(z)), kBoundThreads, 0, stream>>>(a, t);
      return;
    }
    auto go = [&](auto group, auto group_max) {
      constexpr int G = decltype(group)::value;
      constexpr bool M = decltype(group_max)::value;
      // The fast kernel: one wave of blocks (at least one per sequence and KV-head tile, at most
      // one per slot group), so each half-warp walks many pages and pays its prologue (q, the
      // selectors, the first copies' latency) once.
      int64_t xf = x;
      if (sms > 0) xf = std::max<int64_t>(1, int64_t(sms) * BoundWalk<T, G>::kBlocksPerSm / (a.batch * z));
      xf = std::min(xf, slot_groups);
      if (xf > INT32_MAX) error = "page bounds: grid too large";
      else page_bounds_fast<T, G, M><<<dim3(unsigned(xf), unsigned(a.batch), unsigned(z)), kBoundThreads, 0, stream>>>(a, t);
    };
    auto by_group = [&](auto group_max) {
      switch (G) {
        case 1: go(std::integral_constant<int, 1>{}, group_max); break;
        case 2: go(std::integral_constant<int, 2>{}, group_max); break;
        case 4: go(std::integral_constant<int, 4>{}, group_max); break;
        case 7: go(std::integral_constant<int, 7>{}, group_max); break;
        default: go(std::integral_constant<int, 8>{}, group_max); break;
      }
    };
    if (a.group_max) by_group(std::true_type{});
    else by_group(std::false_type{});
  });
  if (error) return error;
  return last_launch_error();
}

}  // namespace sieve::selection
