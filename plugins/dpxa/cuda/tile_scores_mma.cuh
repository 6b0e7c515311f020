// dpxa's tile scores on tensor cores (16-bit Q and K), for dpxa_select.cu, whose launch_scores
// picks this kernel or the scalar one (bit for bit the CPU's). How it works: below.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "cuda/select_device.cuh"
#include "math/dpxa_tiles.hpp"

namespace sieve::dpxa {
namespace {

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
// close); f32 inputs keep the scalar kernel, which matches the CPU bit for bit.
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
  const int64_t page_stride = a.k_strides.page, token_stride = a.k_strides.token;
  const T* kbase = static_cast<const T*>(a.k_pages) + int64_t(g) * a.k_strides.head;
  auto key_row = [&](int32_t pos) {  // 32-bit positions: a 64-bit division costs ~70 instructions
    return kbase + int64_t(pages[pos / ps]) * page_stride + (pos % ps) * token_stride;
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

}  // namespace
}  // namespace sieve::dpxa
