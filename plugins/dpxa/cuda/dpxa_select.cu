// CUDA half of the dpxa plugin: one sequence's block-sparse prefill selection, in six kernels on
// the host's stream (no allocation, no synchronisation):
//   1. anchors  (thread per (block, head))   delta anchors of every query block (per q head) and
//                                             key block (per KV head): the sequential walk of
//                                             dpxa_tiles.hpp, 16-byte reads (estimator=dpxa only);
//   2. scores   the tile's (m, s) pair.  16-bit Q and K (same type, d % 16 == 0): tensor cores,
//               a CTA per (query block, 1-4 heads of a KV head), a warp per key block, mma.sync
//               over the sampled rows (scores_mma_kernel; rounds differently from the CPU in the
//               last bits).  Otherwise: a CTA per (query block, q head), a thread per key block
//               with dpxa_tiles.hpp's score_* (bit for bit the CPU's);
//   3. greedy   (CTA per (query block, q head))  row weights, a bitonic sort of the order keys in
//               shared memory, then the greedy walk by one thread: dpxa_tiles.hpp's
//               row_weights / greedy_walk arithmetic, so given the scores the kept tiles equal the
//               CPU's bit for bit;
//   4. counts   (CTA per selection row)     kept key blocks per row (rows=kv_head: the union of
//                                             the group's flags);
//   5. offsets  (one CTA)                   scan -> the selection's indptr for these rows,
//                                             continuing from indptr[row0] of the sequence before;
//   6. write    (CTA per selection row)     the kept key blocks, ascending, -> indices;
//   7. exact    (CTA per (query block, q head), mode=deltax only) which kept off-diagonal tiles
//               are computed exactly: the row's top ceil(exact_top · n) by the head's share.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "math/dpxa_tiles.hpp"
#include "cuda/dpxa_select.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::dpxa {
namespace {

constexpr int kThreads = 128;
constexpr int kGreedyThreads = 256;
constexpr int kMaxD = 256;
constexpr int kMaxGroups = 256;  // ceil(B / S) for xattn


template <class T>
__device__ const T* key_row_t(const SequenceLaunch& a, int32_t kvh, int64_t pos) {
  const int64_t phys = a.pages[pos / a.page_size];
  return static_cast<const T*>(a.k_pages) +
         ((phys * a.hkv + kvh) * a.page_size + pos % a.page_size) * a.d;
}
template <class T>
__device__ const T* query_row_t(const SequenceLaunch& a, int32_t h, int64_t i) {
  return static_cast<const T*>(a.q) + ((a.q_token0 + i) * a.hq + h) * a.d;
}

// Tiles of query blocks 0 .. t-1 of one head, in closed form: every query block before the last
// is full, so block u sees u + 1 + ceil(base / B) key blocks (base = kv_len - n_new cached
// tokens); Σ_{u<t} = t(t+1)/2 + t·ceil(base / B). (A loop over u cost O(t) divisions per thread
// of every CTA: ~10^3 at 128K.)
__device__ __forceinline__ int64_t row_prefix(const SequenceLaunch& a, int32_t t) {
  const int64_t c = (a.kv_len - a.n_new + a.B - 1) / a.B;
  return int64_t(t) * (t + 1) / 2 + int64_t(t) * c;
}

// x·x and x·y in one pass over the channels, each summed in index order (dpxa_tiles.hpp's dot),
// reading 16 bytes at a time when the rows allow it (element-wise 2-byte reads made the anchor walk
// latency-bound).
template <class T>
__device__ void dot2(const T* x, const T* y, int32_t d, float& xx, float& xy) {
  float sxx = 0.0f, sxy = 0.0f;
  constexpr int32_t kPer = 16 / int32_t(sizeof(T));
  const uintptr_t bits = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y);
  if (d % kPer == 0 && bits % 16 == 0) {
    for (int32_t c = 0; c < d; c += kPer) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + c));
      const uint4 yv = __ldg(reinterpret_cast<const uint4*>(y + c));
      const T* xe = reinterpret_cast<const T*>(&xv);
      const T* ye = reinterpret_cast<const T*>(&yv);
#pragma unroll
      for (int32_t e = 0; e < kPer; ++e) {
        const float xf = to_f32(xe[e]), yf = to_f32(ye[e]);
        sxx = fadd(sxx, fmul(xf, xf));
        sxy = fadd(sxy, fmul(xf, yf));
      }
    }
  } else {
    for (int32_t c = 0; c < d; ++c) {
      const float xf = to_f32(x[c]), yf = to_f32(y[c]);
      sxx = fadd(sxx, fmul(xf, xf));
      sxy = fadd(sxy, fmul(xf, yf));
    }
  }
  xx = sxx;
  xy = sxy;
}

// dpxa_tiles.hpp's delta_anchors with the same arithmetic (x·x and x·a are its two dots).
template <class T, class Row>
__device__ int32_t delta_anchors_dev(const Row& row, int32_t n, int32_t d, float threshold,
                                     uint8_t* out) {
  if (n <= 0) return 0;
  int32_t count = 0;
  out[count++] = 0;
  const T* anchor = row(0);
  float anchor_sq, unused;
  dot2(anchor, anchor, d, anchor_sq, unused);
  for (int32_t i = 1; i < n; ++i) {
    const T* x = row(i);
    float x_sq, xa;
    dot2(x, anchor, d, x_sq, xa);
    if (xa < fmul(threshold, fsqrt(fmul(x_sq, anchor_sq)))) {
      anchor = x;
      anchor_sq = x_sq;
      out[count++] = uint8_t(i);
    }
  }
  return count;
}

// A thread per (block, head) walks its block; 32-thread CTAs spread the few walks (QB·hq + KB·hkv)
// over every SM.
constexpr int kAnchorThreads = 32;
template <class TQ, class TK>
__global__ void __launch_bounds__(kAnchorThreads) anchors_kernel(const SequenceLaunch a) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_q = int64_t(a.QB) * a.hq, n_k = int64_t(a.KB) * a.hkv;
  if (idx < n_q) {
    const int32_t h = int32_t(idx / a.QB), t = int32_t(idx % a.QB);
    const int64_t first = int64_t(t) * a.B;
    const int32_t n = int32_t(::min(int64_t(a.B), a.n_new - first));
    auto row = [&](int32_t i) { return query_row_t<TQ>(a, h, first + i); };
    a.q_counts[idx] = delta_anchors_dev<TQ>(row, n, a.d, a.q_threshold, a.q_anchors + idx * a.B);
  } else if (idx < n_q + n_k) {
    const int64_t k = idx - n_q;
    const int32_t g = int32_t(k / a.KB), j = int32_t(k % a.KB);
    const int64_t first = int64_t(j) * a.B;
    const int32_t n = int32_t(::min(int64_t(a.B), a.kv_len - first));
    auto row = [&](int32_t i) { return key_row_t<TK>(a, g, first + i); };
    a.k_counts[k] = delta_anchors_dev<TK>(row, n, a.d, a.k_threshold, a.k_anchors + k * a.B);
  }
}

template <class TQ, class TK>
__global__ void __launch_bounds__(kThreads) scores_kernel(const SequenceLaunch a) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);  // the query block [nq][d]
  const int32_t t = blockIdx.x, h = blockIdx.y, g = h / (a.hq / a.hkv);
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t q_first = int64_t(t) * a.B;
  const int32_t nq = int32_t(::min(int64_t(a.B), a.n_new - q_first));
  for (int32_t e = threadIdx.x; e < nq * a.d; e += blockDim.x)
    qs[e] = to_f32(query_row_t<TQ>(a, h, q_first + e / a.d)[e % a.d]);
  __syncthreads();
  const int64_t base = int64_t(h) * a.tiles_per_head + row_prefix(a, t);
  const int64_t qa_row = int64_t(h) * a.QB + t;
  float kbuf[kMaxD];       // the key row being scored (thread-local: coalesced local memory)
  float acc[kMaxGroups];   // xattn per-query-group accumulators
  for (int32_t j = threadIdx.x; j < r.n_candidates; j += blockDim.x) {
    const int64_t k_first = int64_t(j) * a.B;
    const int32_t nk = int32_t(::min(int64_t(a.B), a.kv_len - k_first));
    auto qrow = [&](int32_t i) { return qs + i * a.d; };
    auto krow = [&](int32_t i) -> const float* {
      const TK* src = key_row_t<TK>(a, g, k_first + i);
      for (int32_t x = 0; x < a.d; ++x) kbuf[x] = to_f32(src[x]);
      return kbuf;
    };
    const TileGeometry geo{r.first, k_first, nq, nk, a.d};
    TileLse tile;
    if (a.estimator == kDpxa) {
      const int64_t ka_row = int64_t(g) * a.KB + j;
      tile = score_dpxa(geo, qrow, a.q_anchors + qa_row * a.B, a.q_counts[qa_row], krow,
                        a.k_anchors + ka_row * a.B, a.k_counts[ka_row], a.scale);
    } else if (a.estimator == kXattn) {
      tile = score_xattn(geo, qrow, krow, a.S, a.scale_over_s, acc);
    } else {
      tile = score_stride(geo, qrow, krow, a.S, a.scale);
    }
    a.tiles[(base + j) * 2] = tile.m;
    a.tiles[(base + j) * 2 + 1] = tile.s;
  }
}

// ---- Tile scores on tensor cores (16-bit Q and K) ------------------------------------------
// Every estimator samples a small matrix per tile: rows = sampled queries, columns = sampled keys,
// inner dimension d (dpxa: anchors x anchors; stride: every S-th x every S-th) or S·d (xattn:
// group gq is q[gq·S + s] concatenated over s, group gk is k[gk·S + S-1-s]). The tile score is the
// log-sum-exp of its causal entries. That is a GEMM: mma.sync m16n8k16 (f32 accumulate) on the
// sampled rows staged in shared memory (A, read with ldmatrix; `hpc` query heads of one KV head
// stacked) against the sampled key rows read straight from the paged cache into B fragments (each
// key element is loaded once per CTA and used for all stacked heads; the next step's fragments
// are loaded while the tensor cores work on this one). A warp per key block, no CTA-wide
// synchronisation after staging. The exponentials are the hardware's (ex2.approx) and the dot
// products round in the tensor core's order, so these scores differ from the CPU's in the last
// bits (the selection can differ only where two tile shares, or the kept share and τ, are that
// close); f32 inputs keep the scalar kernel above, which matches the CPU bit for bit.
constexpr int kMmaWarps = 8;
constexpr int kMmaTiles = 4;          // m-tiles (16 stacked query rows) accumulated at once
constexpr int kMaxHeadsPerCta = 4;
constexpr int kMaxRowTiles = 16;      // m-tiles per head: ceil(B / 16) with B <= 256
constexpr int32_t kNoRow = INT32_MIN, kNoCol = INT32_MAX;

template <class T>
struct MmaType;
template <>
struct MmaType<__nv_bfloat16> {
  __device__ static void mma(float (&c)[4], const uint32_t (&x)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "r"(b0), "r"(b1));
  }
};
template <>
struct MmaType<__half> {
  __device__ static void mma(float (&c)[4], const uint32_t (&x)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3]), "r"(b0), "r"(b1));
  }
};

constexpr float kLog2e = 1.44269504f, kLn2 = 0.693147181f;
__device__ __forceinline__ float ex2(float x) {  // 2^x, hardware approximation; 2^-inf = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Log-sum-exp pairs in log2 units (the mass is s·2^m): merge (m2, s2) into (m, s).
__device__ __forceinline__ void lse_merge2(float& m, float& s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  if (M == -INFINITY) return;
  s = s * ex2(m - M) + s2 * ex2(m2 - M);
  m = M;
}

// Shared-memory bytes of scores_mma_kernel for `hpc` stacked heads.
size_t mma_smem_bytes(const SequenceLaunch& a, int32_t hpc) {
  const int32_t rows = a.estimator == kDpxa ? a.B : (a.B + a.S - 1) / a.S;
  const int32_t rows_cap = (rows + 15) / 16 * 16;
  const int32_t kdim = a.estimator == kXattn ? a.S * a.d : a.d;
  return size_t(hpc) * rows_cap * (size_t(kdim + 8) * 2 + 4);
}

template <class T>
__global__ void __launch_bounds__(kMmaWarps * 32, 3)
    scores_mma_kernel(const SequenceLaunch a, int32_t hpc) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int32_t mt_head[kMaxHeadsPerCta * kMaxRowTiles];  // stacked m-tile -> head
  __shared__ int32_t head_row0[kMaxHeadsPerCta], head_rows[kMaxHeadsPerCta];
  __shared__ int32_t n_mt;
  __shared__ float warp_lse[kMmaWarps][kMaxHeadsPerCta][2];
  const bool dpxa = a.estimator == kDpxa, xattn = a.estimator == kXattn;
  const int32_t S = a.S, d = a.d, B = a.B;
  const int32_t kdim = xattn ? S * d : d, ld = kdim + 8;  // +8: conflict-free fragment loads
  const int32_t rows_cap = ((dpxa ? B : (B + S - 1) / S) + 15) / 16 * 16;
  T* qs = reinterpret_cast<T*>(smem);  // [hpc * rows_cap][ld]
  int32_t* qoff = reinterpret_cast<int32_t*>(qs + size_t(hpc) * rows_cap * ld);
  const int32_t group = a.hq / a.hkv;
  const int32_t h0 = int32_t(blockIdx.x) * hpc, g = h0 / group;
  const int32_t t = a.QB - 1 - int32_t(blockIdx.y);  // longest rows first
  const RowSpan r = row_span(a.kv_len, a.n_new, B, t);
  const int64_t q_first = int64_t(t) * B;
  const int32_t nq = int32_t(::min(int64_t(B), a.n_new - q_first));
  const int32_t n_groups = (nq + S - 1) / S;
  const int32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Stacked layout: head hh's sampled rows, padded to 16, after those of heads < hh.
  if (threadIdx.x == 0) {
    int32_t m = 0;
    for (int32_t hh = 0; hh < hpc; ++hh) {
      const int32_t nr = dpxa ? a.q_counts[int64_t(h0 + hh) * a.QB + t] : n_groups;
      head_row0[hh] = m * 16;
      head_rows[hh] = nr;
      for (int32_t i = 0; i < (nr + 15) / 16; ++i) mt_head[m + i] = hh;
      m += (nr + 15) / 16;
    }
    n_mt = m;
  }
  __syncthreads();
  const int32_t n_rows = n_mt * 16, pairs = kdim / 2;
  for (int32_t e = threadIdx.x; e < n_rows * pairs; e += blockDim.x) {
    const int32_t R = e / pairs, kk = (e - R * pairs) * 2;
    const int32_t hh = mt_head[R / 16], lr = R - head_row0[hh];
    const int32_t s = kk / d, c = kk - s * d;
    uint32_t v = 0;
    int32_t tok = -1;
    if (lr < head_rows[hh]) {
      const uint8_t* qa = a.q_anchors + (int64_t(h0 + hh) * a.QB + t) * B;
      tok = dpxa ? qa[lr] : xattn ? lr * S + s : lr * S;
      if (tok < nq)
        v = *reinterpret_cast<const uint32_t*>(query_row_t<T>(a, h0 + hh, q_first + tok) + c);
    }
    reinterpret_cast<uint32_t*>(qs)[(R * ld + kk) / 2] = v;
    if (kk == 0)  // the query offset that decides causality: xattn, the group's last query
      qoff[R] = lr >= head_rows[hh] ? kNoRow
                : dpxa             ? tok
                : xattn            ? ::min(lr * S + S - 1, nq - 1)
                                   : lr * S;
  }
  __syncthreads();

  const int64_t tile_base = row_prefix(a, t);
  const uint32_t qs_addr = uint32_t(__cvta_generic_to_shared(qs));
  // Logits in log2 units (one ex2 per logit): tile pairs are (m·log2 e, s) until written.
  const float scale_log2 = (xattn ? a.scale_over_s : a.scale) * kLog2e;
  const int32_t ps = a.page_size;
  const int32_t* pages = a.pages;
  const int32_t kv_stride = a.hkv * ps * d;  // elements per physical page
  const T* kbase = static_cast<const T*>(a.k_pages) + int64_t(g) * ps * d;
  auto key_row = [&](int32_t pos) {  // 32-bit positions: a 64-bit division costs ~70 instructions
    return kbase + int64_t(pages[pos / ps]) * kv_stride + (pos % ps) * d;
  };
  auto columns = [&](int32_t jj) {  // sampled key columns of key block jj
    const int32_t nk = int32_t(::min(int64_t(B), a.kv_len - int64_t(jj) * B));
    return dpxa ? a.k_counts[int64_t(g) * a.KB + jj] : (nk + S - 1) / S;
  };
  // The warp walks steps (key block j, m-group mg, column chunk n0, k-group kg) in that order,
  // loading the B fragments of the next step while the tensor cores work on this one.
  struct Step {
    int32_t j, mg, n0, kg, nc;
  };
  auto advance = [&](Step st) {
    st.kg += 128;
    if (st.kg < kdim) return st;
    st.kg = 0;
    st.n0 += 8;
    if (st.n0 < st.nc) return st;
    st.n0 = 0;
    st.mg += kMmaTiles;
    if (st.mg < n_mt) return st;
    st.mg = 0;
    st.j += kMmaWarps;
    if (st.j < r.n_candidates) st.nc = columns(st.j);
    return st;
  };
  auto load_b = [&](const Step& st, uint32_t (&bf)[8][2]) {
    const int32_t k_first = st.j * B;
    const int32_t nk = int32_t(::min(int64_t(B), a.kv_len - int64_t(k_first)));
    const int32_t bcol = st.n0 + lane / 4;
    const bool bvalid = bcol < st.nc;
    const int32_t btok =
        !bvalid ? 0 : dpxa ? int32_t(a.k_anchors[(int64_t(g) * a.KB + st.j) * B + bcol]) : bcol * S;
    const T* brow = key_row(k_first + (xattn ? 0 : btok));
#pragma unroll
    for (int32_t ks = 0; ks < 8; ++ks) {
      bf[ks][0] = bf[ks][1] = 0;
      const int32_t kk = st.kg + ks * 16 + (lane % 4) * 2;
      if (kk < kdim && bvalid) {
        const int32_t s = xattn ? kk / d : 0, c = kk - s * d;
        const T* p = brow;
        bool ok = true;
        if (xattn) {
          const int32_t tok = btok + S - 1 - s;
          ok = tok < nk;
          p = key_row(k_first + (ok ? tok : 0));
        }
        if (ok) {
          bf[ks][0] = __ldg(reinterpret_cast<const uint32_t*>(p + c));
          bf[ks][1] = __ldg(reinterpret_cast<const uint32_t*>(p + c + 8));
        }
      }
    }
  };

  Step cur{warp, 0, 0, 0, 0};
  if (cur.j >= r.n_candidates) return;
  cur.nc = columns(cur.j);
  uint32_t bf[8][2], bn[8][2];
  load_b(cur, bf);
  float acc[kMmaTiles][4], lm[kMmaTiles], ls[kMmaTiles];
  if (lane < hpc) warp_lse[warp][lane][0] = -INFINITY, warp_lse[warp][lane][1] = 0.f;
  __syncwarp();
#pragma unroll
  for (int32_t mt = 0; mt < kMmaTiles; ++mt) lm[mt] = -INFINITY, ls[mt] = 0.f;
  while (true) {
    const Step nxt = advance(cur);
    if (nxt.j < r.n_candidates) load_b(nxt, bn);
    const int32_t mt_n = ::min(kMmaTiles, n_mt - cur.mg);
    if (cur.kg == 0) {
#pragma unroll
      for (int32_t mt = 0; mt < kMmaTiles; ++mt)
        acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
    }
#pragma unroll
    for (int32_t ks = 0; ks < 8; ++ks) {
      if (cur.kg + ks * 16 >= kdim) break;
#pragma unroll
      for (int32_t mt = 0; mt < kMmaTiles; ++mt) {
        if (mt >= mt_n) break;
        // ldmatrix.x4: lanes 0-15 address rows 0-15 at k, lanes 16-31 the same rows at k + 8.
        const uint32_t addr = qs_addr + uint32_t((((cur.mg + mt) * 16 + lane % 16) * ld +
                                                  cur.kg + ks * 16 + (lane / 16) * 8) * 2);
        uint32_t x[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(x[0]), "=r"(x[1]), "=r"(x[2]), "=r"(x[3])
                     : "r"(addr));
        MmaType<T>::mma(acc[mt], x, bf[ks][0], bf[ks][1]);
      }
    }
    const bool chunk_done = cur.kg + 128 >= kdim;
    if (chunk_done) {
      // This lane's accumulator columns n0 + (lane % 4)·2 + {0, 1}: their key offsets. A key
      // offset koff is scored by a row with query offset qo iff koff <= qo + delta; key blocks
      // before the diagonal ones are causal for every query of the block.
      const int32_t k_first = cur.j * B;
      const int64_t delta = r.first - k_first;
      const bool below_diagonal = cur.j < r.diag_first;
      int32_t koff[2];
#pragma unroll
      for (int32_t e = 0; e < 2; ++e) {
        const int32_t col = cur.n0 + (lane % 4) * 2 + e;
        koff[e] = col >= cur.nc ? kNoCol
                  : dpxa        ? int32_t(a.k_anchors[(int64_t(g) * a.KB + cur.j) * B + col])
                                : col * S;
      }
#pragma unroll
      for (int32_t mt = 0; mt < kMmaTiles; ++mt) {
        if (mt >= mt_n) break;
        const int32_t R = (cur.mg + mt) * 16 + lane / 4;
        const int32_t qo[2] = {qoff[R], qoff[R + 8]};
        float v[4];
        bool ok[4];
        float cmax = -INFINITY;
#pragma unroll
        for (int32_t e = 0; e < 4; ++e) {
          const int32_t q = qo[e / 2], k = koff[e % 2];
          v[e] = acc[mt][e] * scale_log2;
          ok[e] = q != kNoRow && k != kNoCol && v[e] == v[e] &&
                  (below_diagonal || int64_t(k) <= int64_t(q) + delta);
          if (ok[e]) cmax = fmaxf(cmax, v[e]);
        }
        if (cmax > lm[mt]) {
          ls[mt] *= ex2(lm[mt] - cmax);
          lm[mt] = cmax;
        }
#pragma unroll
        for (int32_t e = 0; e < 4; ++e)
          if (ok[e]) ls[mt] += ex2(v[e] - lm[mt]);
      }
    }
    if (chunk_done && (nxt.mg != cur.mg || nxt.j != cur.j)) {
      // The m-group is done. Consecutive m-tiles of one head merge in registers first; then each
      // head's pair over the warp, folded into the head's by lane 0.
      bool last_of_head[kMmaTiles];
#pragma unroll
      for (int32_t mt = 0; mt < kMmaTiles; ++mt) {
        last_of_head[mt] = mt < mt_n;
        if (mt + 1 < kMmaTiles && mt + 1 < mt_n &&
            mt_head[cur.mg + mt] == mt_head[cur.mg + mt + 1]) {
          lse_merge2(lm[mt + 1], ls[mt + 1], lm[mt], ls[mt]);
          last_of_head[mt] = false;
        }
      }
#pragma unroll
      for (int32_t mt = 0; mt < kMmaTiles; ++mt) {
        if (mt >= mt_n) break;
        if (last_of_head[mt]) {
          for (int32_t off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, lm[mt], off);
            const float s2 = __shfl_xor_sync(0xffffffffu, ls[mt], off);
            lse_merge2(lm[mt], ls[mt], m2, s2);
          }
          if (lane == 0) {
            const int32_t hh = mt_head[cur.mg + mt];
            lse_merge2(warp_lse[warp][hh][0], warp_lse[warp][hh][1], lm[mt], ls[mt]);
          }
        }
        lm[mt] = -INFINITY;
        ls[mt] = 0.f;
      }
      if (nxt.j != cur.j) {  // the key block is done: write its tiles (one per stacked head)
        __syncwarp();
        if (lane < hpc) {
          const int64_t at = (int64_t(h0 + lane) * a.tiles_per_head + tile_base + cur.j) * 2;
          a.tiles[at] = warp_lse[warp][lane][0] * kLn2;  // log2 units -> the logits' units
          a.tiles[at + 1] = warp_lse[warp][lane][1];
          warp_lse[warp][lane][0] = -INFINITY;
          warp_lse[warp][lane][1] = 0.f;
        }
        __syncwarp();
      }
    }
    if (nxt.j >= r.n_candidates) break;
    cur = nxt;
#pragma unroll
    for (int32_t ks = 0; ks < 8; ++ks) bf[ks][0] = bn[ks][0], bf[ks][1] = bn[ks][1];
  }
}

// NaN-skipping max (the CPU's row_weights never lets a NaN m win), so any reduction order gives
// the same M.
struct MaxSkipNan {
  __device__ float operator()(float x, float y) const {
    if (x != x) return y;
    if (y != y) return x;
    return y > x ? y : x;
  }
};

// Block-wide bitonic sort of keys[0 .. pow2) (a power of two), descending; every thread of the
// CTA calls it, and it ends on a barrier.
__device__ void sort_descending(uint64_t* keys, int32_t pow2) {
  for (int32_t size = 2; size <= pow2; size <<= 1)  // bitonic sort, descending
    for (int32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int32_t i = threadIdx.x; i < pow2; i += blockDim.x) {
        const int32_t p = i ^ stride;
        if (p > i) {
          const bool desc = (i & size) == 0;
          const uint64_t x = keys[i], y = keys[p];
          if (desc ? x < y : x > y) {
            keys[i] = y;
            keys[p] = x;
          }
        }
      }
      __syncthreads();
    }
}

// One CTA per row: row_weights / greedy_walk of dpxa_tiles.hpp with every order-free part in
// parallel (the max, the weights, the sort keys, gathering weights in greedy order) and the two
// order-sensitive sums (Σ w in index order, the kept mass in greedy order) on one thread over
// shared memory, so the kept tiles equal the CPU's bit for bit. The bitonic sort spans the row's
// own candidates (rounded up to a power of 2), not the longest row's.
__global__ void __launch_bounds__(kGreedyThreads) greedy_kernel(const SequenceLaunch a) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Reduce = cub::BlockReduce<float, kGreedyThreads>;
  __shared__ typename Reduce::TempStorage reduce_temp;
  __shared__ float row_max, row_z;
  __shared__ int32_t n_keep;
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int32_t n = r.n_candidates;
  int32_t pow2 = 1;
  while (pow2 < n) pow2 <<= 1;
  uint64_t* keys = reinterpret_cast<uint64_t*>(smem);  // [pow2]
  float* w = reinterpret_cast<float*>(keys + pow2);     // [n] weights in index order
  float* ws = w + n;                                    // [n] weights in greedy order
  const int64_t base = int64_t(h) * a.tiles_per_head + row_prefix(a, t);
  const TileLse* tiles = reinterpret_cast<const TileLse*>(a.tiles) + base;
  uint8_t* keep = a.keep + base;
  float m = -INFINITY;
  for (int32_t j = threadIdx.x; j < n; j += blockDim.x) m = MaxSkipNan{}(m, tiles[j].m);
  m = Reduce(reduce_temp).Reduce(m, MaxSkipNan{});
  if (threadIdx.x == 0) row_max = m;
  __syncthreads();
  const float M = row_max;
  for (int32_t j = threadIdx.x; j < pow2; j += blockDim.x) {
    float wj = 0.f;
    if (j < n) {
      const TileLse tl = tiles[j];
      wj = tl.s > 0.0f ? fmul(tl.s, exp_neg(fsub(tl.m, M))) : 0.0f;  // row_weights' w_j
      w[j] = wj;
      keep[j] = forced(r, j) ? 1 : 0;
    }
    // Forced tiles and padding get 0, which sorts after every real key.
    keys[j] = j < n && !forced(r, j) ? order_key(wj, j) : 0ull;
  }
  __syncthreads();
  sort_descending(keys, pow2);
  // Non-forced candidates: n minus block 0 and the diagonal blocks diag_first .. n-1.
  const int32_t n_sorted = n - (n - r.diag_first) - (r.diag_first > 0 ? 1 : 0);
  for (int32_t i = threadIdx.x; i < n_sorted; i += blockDim.x) ws[i] = w[order_index(keys[i])];
  __syncthreads();
  if (threadIdx.x == 0) {
    float z = 0.0f;  // Σ w in index order (row_weights)
    for (int32_t j = 0; j < n; ++j) z = fadd(z, w[j]);
    float kept = 0.0f;  // forced mass in index order, then the greedy walk (greedy_walk)
    for (int32_t j = 0; j < n; j = j == 0 && r.diag_first > 1 ? r.diag_first : j + 1)
      kept = fadd(kept, w[j]);
    const float target = fmul(a.tau[h], z);
    const bool all = !(a.tau[h] < 1.0f);
    int32_t c = 0;
    for (; c < n_sorted && (all || kept < target); ++c) kept = fadd(kept, ws[c]);
    n_keep = c;
    row_z = z;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < n_keep; i += blockDim.x) keep[order_index(keys[i])] = 1;
  if (a.shares) {  // deltax: row_shares' w / z, IEEE-rounded like the CPU's division
    const float z = row_z;
    for (int32_t j = threadIdx.x; j < n; j += blockDim.x)
      a.shares[base + j] = z > 0.f ? __fdiv_rn(w[j], z) : 0.f;
  }
}

// Kept flag of key block j in local selection row (t, hrow).
__device__ bool row_keeps(const SequenceLaunch& a, int32_t t, int32_t hrow, int64_t prefix,
                          int32_t j) {
  if (!a.rows_per_kv_head) return a.keep[int64_t(hrow) * a.tiles_per_head + prefix + j] != 0;
  const int32_t group = a.hq / a.hkv;
  for (int32_t h = hrow * group; h < (hrow + 1) * group; ++h)
    if (a.keep[int64_t(h) * a.tiles_per_head + prefix + j]) return true;
  return false;
}

__global__ void __launch_bounds__(kThreads) counts_kernel(const SequenceLaunch a, int32_t H) {
  using Reduce = cub::BlockReduce<int32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int32_t r_local = blockIdx.x, t = r_local / H, hrow = r_local % H;
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t prefix = row_prefix(a, t);
  int32_t c = 0;
  for (int32_t j = threadIdx.x; j < r.n_candidates; j += blockDim.x)
    c += row_keeps(a, t, hrow, prefix, j) ? 1 : 0;
  const int32_t total = Reduce(temp).Sum(c);
  if (threadIdx.x == 0) a.row_counts[r_local] = total;
}

__global__ void __launch_bounds__(kGreedyThreads) offsets_kernel(const SequenceLaunch a,
                                                                  int32_t n_rows) {
  using Scan = cub::BlockScan<int32_t, kGreedyThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t base;
  if (threadIdx.x == 0) {
    base = a.row0 == 0 ? 0 : a.sel_indptr[a.row0];
    if (a.row0 == 0) a.sel_indptr[0] = 0;
  }
  __syncthreads();
  int32_t running = base;
  for (int32_t c0 = 0; c0 < n_rows; c0 += kGreedyThreads) {
    const int32_t i = c0 + int32_t(threadIdx.x);
    const int32_t v = i < n_rows ? a.row_counts[i] : 0;
    int32_t incl, total;
    Scan(temp).InclusiveSum(v, incl, total);
    if (i < n_rows) a.sel_indptr[a.row0 + i + 1] = running + incl;
    running += total;
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) write_kernel(const SequenceLaunch a, int32_t H) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int32_t r_local = blockIdx.x, t = r_local / H, hrow = r_local % H;
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t prefix = row_prefix(a, t);
  int64_t out = a.sel_indptr[a.row0 + r_local];
  for (int32_t c0 = 0; c0 < r.n_candidates; c0 += kThreads) {
    const int32_t j = c0 + int32_t(threadIdx.x);
    const int32_t flag = j < r.n_candidates && row_keeps(a, t, hrow, prefix, j) ? 1 : 0;
    int32_t pos, total;
    Scan(temp).ExclusiveSum(flag, pos, total);
    // The host checked the worst case (every candidate kept) against the capacity.
    if (flag && out + pos < a.capacity) a.sel_indices[out + pos] = j;
    out += total;
    __syncthreads();
  }
}

// deltax: per (query block t, q head h), the tiles of h's selection row (its own kept tiles, or
// the group's union with rows=kv_head) that are neither sink nor diagonal, ranked by h's share
// with ties to the lower block (the order key of the greedy, over shares), as deltax.hpp's
// exact_tiles on the CPU; the first ceil(exact_top · n) get their bit set. A bitonic sort in
// shared memory as in greedy_kernel; bits are gathered with shared atomics, then stored whole.
__global__ void __launch_bounds__(kGreedyThreads) exact_kernel(const SequenceLaunch a) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Reduce = cub::BlockReduce<int32_t, kGreedyThreads>;
  __shared__ typename Reduce::TempStorage reduce_temp;
  __shared__ int32_t n_rank;
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int32_t n = r.n_candidates;
  int32_t pow2 = 1;
  while (pow2 < n) pow2 <<= 1;
  uint64_t* keys = reinterpret_cast<uint64_t*>(smem);            // [pow2]
  uint32_t* words = reinterpret_cast<uint32_t*>(keys + pow2);    // [exact_words]
  const int64_t prefix = row_prefix(a, t);
  const int32_t hrow = a.rows_per_kv_head ? h / (a.hq / a.hkv) : h;
  const float* shares = a.shares + int64_t(h) * a.tiles_per_head + prefix;
  int32_t members = 0;
  for (int32_t j = threadIdx.x; j < pow2; j += blockDim.x) {
    const bool member = j < n && !forced(r, j) && row_keeps(a, t, hrow, prefix, j);
    members += member ? 1 : 0;
    keys[j] = member ? order_key(shares[j], j) : 0ull;  // members' keys are never 0
  }
  for (int32_t i = threadIdx.x; i < a.exact_words; i += blockDim.x) words[i] = 0u;
  members = Reduce(reduce_temp).Sum(members);
  if (threadIdx.x == 0) {
    // exact_tiles' count: ceil in double, the 1e-6 absorbing products like 0.3 · 10.
    const int32_t top = int32_t(ceil(double(a.exact_top) * members - 1e-6));
    n_rank = top < members ? top : members;
  }
  __syncthreads();
  sort_descending(keys, pow2);
  for (int32_t i = threadIdx.x; i < n_rank; i += blockDim.x) {
    const int32_t j = order_index(keys[i]);
    atomicOr(&words[j >> 5], 1u << (j & 31));
  }
  __syncthreads();
  uint32_t* out = a.exact_bits + (int64_t(t) * a.hq + h) * a.exact_words;
  for (int32_t i = threadIdx.x; i < a.exact_words; i += blockDim.x) out[i] = words[i];
}

__global__ void empty_kernel(int32_t* indptr) { indptr[0] = 0; }

// Tile scores: on tensor cores when Q and K are the same 16-bit type and d is a multiple of 16
// (the stacked query rows of up to 4 heads of a KV group in shared memory, as many heads as fit in
// kMmaSmemBudget); otherwise the scalar kernel (bit for bit the CPU's).
constexpr size_t kMmaSmemBudget = 80 * 1024;

template <class TQ, class TK>
const char* launch_scores(const SequenceLaunch& a, cudaStream_t stream) {
  if constexpr (std::is_same_v<TQ, TK> && !std::is_same_v<TQ, float>) {
    const int32_t group = a.hq / a.hkv;
    int32_t hpc = 1;
    for (int32_t c = kMaxHeadsPerCta; c > 1; --c)
      if (group % c == 0 && mma_smem_bytes(a, c) <= kMmaSmemBudget) {
        hpc = c;
        break;
      }
    const size_t bytes = mma_smem_bytes(a, hpc);
    if (a.d % 16 == 0 && a.B <= kMaxRowTiles * 16 && bytes <= 200 * 1024) {
      if (const cudaError_t e = cudaFuncSetAttribute(
              scores_mma_kernel<TQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
          e != cudaSuccess)
        return cudaGetErrorString(e);
      scores_mma_kernel<TQ><<<dim3(unsigned(a.hq / hpc), unsigned(a.QB)), kMmaWarps * 32, bytes,
                              stream>>>(a, hpc);
      const cudaError_t e = cudaGetLastError();
      return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
    }
  }
  const size_t q_bytes = size_t(a.B) * a.d * sizeof(float);
  if (const cudaError_t e = cudaFuncSetAttribute(
          scores_kernel<TQ, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(q_bytes));
      e != cudaSuccess)
    return cudaGetErrorString(e);
  scores_kernel<TQ, TK><<<dim3(unsigned(a.QB), unsigned(a.hq)), kThreads, q_bytes, stream>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <class TQ, class TK>
const char* launch_typed(const SequenceLaunch& a) {
  auto stream = static_cast<cudaStream_t>(a.stream);
  auto check = []() -> const char* {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  };
  if (a.estimator == kDpxa) {
    const int64_t threads = int64_t(a.QB) * a.hq + int64_t(a.KB) * a.hkv;
    anchors_kernel<TQ, TK><<<unsigned((threads + kAnchorThreads - 1) / kAnchorThreads),
                             kAnchorThreads, 0, stream>>>(a);
    if (const char* e = check()) return e;
  }
  const dim3 rows(unsigned(a.QB), unsigned(a.hq));
  if (const char* e = launch_scores<TQ, TK>(a, stream)) return e;
  int32_t pow2 = 1;
  while (pow2 < a.KB) pow2 <<= 1;
  const size_t g_bytes = size_t(pow2) * 8 + size_t(a.KB) * 8;
  if (const cudaError_t e = cudaFuncSetAttribute(
          greedy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(g_bytes));
      e != cudaSuccess)
    return cudaGetErrorString(e);
  greedy_kernel<<<rows, kGreedyThreads, g_bytes, stream>>>(a);
  if (const char* e = check()) return e;
  const int32_t H = a.rows_per_kv_head ? a.hkv : a.hq;
  const int32_t n_rows = a.QB * H;
  counts_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(a, H);
  if (const char* e = check()) return e;
  offsets_kernel<<<1, kGreedyThreads, 0, stream>>>(a, n_rows);
  if (const char* e = check()) return e;
  write_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(a, H);
  if (const char* e = check()) return e;
  if (a.exact_bits) {
    const size_t e_bytes = size_t(pow2) * 8 + size_t(a.exact_words) * 4;
    if (const cudaError_t e = cudaFuncSetAttribute(
            exact_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(e_bytes));
        e != cudaSuccess)
      return cudaGetErrorString(e);
    exact_kernel<<<rows, kGreedyThreads, e_bytes, stream>>>(a);
  }
  return check();
}

}  // namespace

ScratchSizes scratch_sizes(int32_t max_seq_len, int32_t B, int32_t hq, int32_t hkv) {
  const size_t blocks = size_t(max_seq_len + B - 1) / size_t(B);
  // Σ_t n_candidates(t) <= KB (KB + 1) / 2 (each earlier query block sees one key block less).
  const size_t tiles = blocks * (blocks + 1) / 2;
  ScratchSizes s;
  s.q_anchors = size_t(hq) * blocks * size_t(B);
  s.q_counts = size_t(hq) * blocks * 4;
  s.k_anchors = size_t(hkv) * blocks * size_t(B);
  s.k_counts = size_t(hkv) * blocks * 4;
  s.tiles = size_t(hq) * tiles * 8;
  s.keep = size_t(hq) * tiles;
  s.row_counts = size_t(hq) * blocks * 4;
  return s;
}

const char* launch_empty(const SequenceLaunch& a) noexcept {
  empty_kernel<<<1, 1, 0, static_cast<cudaStream_t>(a.stream)>>>(a.sel_indptr);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* launch_sequence(const SequenceLaunch& a) noexcept {
  if (a.QB <= 0) return nullptr;
  if (a.d > kMaxD || (a.B + a.S - 1) / a.S > kMaxGroups) return "head_dim or B / S too large";
  return dispatch_cuda_storage(a.q_dtype, [&](auto q) {
    return dispatch_cuda_storage(a.kv_dtype, [&](auto k) {
      return launch_typed<typename decltype(q)::type, typename decltype(k)::type>(a);
    });
  });
}

}  // namespace sieve::dpxa
