// The tiled prefill kernel: causal flash attention over the paged cache, dense or block-sparse
// (BSR: query block x key block), f32 accumulation with plain FMA.
//
// Grid (query tile, head unit, sequence). A CTA owns up to 64 "rows" = query tokens x the head
// unit's query heads (GQA packing: a group's heads share every K/V tile), with the tokens taken
// from one selection query block, so the whole tile reads one selection row. It walks key tiles of
// 32 tokens over the visible key ranges (one range when dense, one per selected key block),
// converting each K/V tile to f32 in shared memory, then
//   S = Q Kᵀ (tile_scores), online softmax (log2 domain), O += P V (tile_pv).
// tile_scores / tile_pv are the inner loops a tensor-core (MMA) version replaces later; the
// thread layout is 16 x 8: a thread owns 4 rows and 4 key columns of S and 4 rows x D/8 columns
// of O.
#include "attention_cuda_common.cuh"

namespace sieve::kernels::cuda {
namespace {

constexpr int kRows = 64;   // rows (token, head) per CTA
constexpr int kKeys = 32;   // keys per tile
constexpr int kRowsPerThread = kRows / 16;
constexpr int kColsPerThread = kKeys / 8;

template <int D>
struct PrefillSmem {
  static constexpr int QS = D + 1;  // padded strides: rows read by different lanes hit different banks
  static constexpr int KS = D + 1;
  static constexpr int PS = kKeys + 1;
  static constexpr size_t floats = size_t(kRows) * QS + size_t(kKeys) * KS + size_t(kKeys) * D +
                                   size_t(kRows) * PS;
  static constexpr size_t bytes = floats * sizeof(float) + (kRows + kKeys) * sizeof(int32_t) + 16;
};

// S[i][j] = q(row ty*4+i) · k(col tx+8j).
template <int D>
__device__ inline void tile_scores(const float* Qs, const float* Ks, int ty, int tx,
                                   float (&S)[kRowsPerThread][kColsPerThread]) {
  using L = PrefillSmem<D>;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) S[i][j] = 0.f;
#pragma unroll 8
  for (int d = 0; d < D; ++d) {
    float qv[kRowsPerThread], kv[kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) qv[i] = Qs[(ty * kRowsPerThread + i) * L::QS + d];
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) kv[j] = Ks[(tx + 8 * j) * L::KS + d];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) S[i][j] = fmaf(qv[i], kv[j], S[i][j]);
  }
}

// O[i][c] += Σ_k P(row ty*4+i, k) V(k, tx+8c).
template <int D>
__device__ inline void tile_pv(const float* Ps, const float* Vs, int ty, int tx,
                               float (&O)[kRowsPerThread][D / 8 > 0 ? D / 8 : 1]) {
  using L = PrefillSmem<D>;
  constexpr int DC = D / 8;
#pragma unroll 4
  for (int k = 0; k < kKeys; ++k) {
    float pv[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) pv[i] = Ps[(ty * kRowsPerThread + i) * L::PS + k];
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const float v = Vs[k * D + tx + 8 * c];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) O[i][c] = fmaf(pv[i], v, O[i][c]);
    }
  }
}

template <class KT, int D>
__global__ void __launch_bounds__(kThreads) prefill_kernel(const AttnParams p, int32_t tile_tokens) {
  static_assert(D % 8 == 0, "head_dim must be a multiple of 8");
  using L = PrefillSmem<D>;
  constexpr int VEC = Vec16<KT>::N;
  constexpr int DC = D / 8;
  extern __shared__ __align__(16) float smem[];
  float* Qs = smem;
  float* Ks = Qs + kRows * L::QS;
  float* Vs = Ks + kKeys * L::KS;
  float* Ps = Vs + kKeys * D;
  int32_t* row_pos = reinterpret_cast<int32_t*>(Ps + kRows * L::PS);  // query position, -1: none
  int32_t* key_ok = row_pos + kRows;                                   // key column holds a key

  const int tid = threadIdx.x;
  const int ty = tid / 8, tx = tid % 8;
  const int32_t b = blockIdx.z;
  const int32_t unit = blockIdx.y;
  const auto [kvh, h0, nh] = head_unit(p, unit);

  // This tile's query tokens: [q0, q1) of the sequence, inside one selection query block.
  const auto [qo0, n_q, qb, tiles_per_block] = prefill_blocks(p, b, tile_tokens);
  const int32_t qblock = blockIdx.x / tiles_per_block;
  const int32_t q0 = qblock * qb + (blockIdx.x % tiles_per_block) * tile_tokens;
  const int32_t q1 = min(min(q0 + tile_tokens, (qblock + 1) * qb), n_q);
  if (q0 >= q1) return;

  const int32_t page_base = __ldg(p.kv_indptr + b);
  const int32_t n_pages = __ldg(p.kv_indptr + b + 1) - page_base;
  const int32_t kv_len = n_pages > 0 ? (n_pages - 1) * p.page_size + __ldg(p.kv_last + b) : 0;
  const int32_t first_pos = kv_len - n_q;  // position of query token 0 of the sequence
  const int32_t n_rows = (q1 - q0) * nh;

  // Q tile: row = token * nh + head, pre-scaled into the log2 domain.
  for (int i = tid; i < kRows * D; i += kThreads) {
    const int row = i / D, d = i % D;
    float v = 0.f;
    if (row < n_rows) {
      const int32_t tok = qo0 + q0 + row / nh;
      v = load_storage(p.q, p.q_dt, (int64_t(tok) * p.hq + h0 + row % nh) * D + d) * p.scale_log2;
    }
    Qs[row * L::QS + d] = v;
  }
  for (int row = tid; row < kRows; row += kThreads)
    row_pos[row] = row < n_rows ? first_pos + q0 + row / nh : -1;
  const int32_t max_pos = first_pos + q1 - 1;

  float O[kRowsPerThread][DC > 0 ? DC : 1];
  float m[kRowsPerThread], lsum[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    m[i] = kNegInf;
    lsum[i] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) O[i][c] = 0.f;
  }

  const KT* kbase = static_cast<const KT*>(p.k);
  const KT* vbase = static_cast<const KT*>(p.v);
  const int P = p.page_size;

  // One key tile [kt0, kt0 + kKeys) ∩ [.., re): load, score, softmax, accumulate.
  auto attend_tile = [&](int32_t kt0, int32_t re) {
    __syncthreads();  // the previous tile's Ks / Vs / Ps are no longer read
    constexpr int VPR = D / VEC;  // 16-byte vectors per key row
    for (int i = tid; i < kKeys * VPR; i += kThreads) {
      const int c = i / VPR, part = i % VPR;
      const int32_t t = kt0 + c;
      float kf[VEC], vf[VEC];
      bool ok = t < re;
      if (ok) {
        const int32_t page = p.page_shift >= 0 ? t >> p.page_shift : t / P;
        const int32_t phys = physical_page(p, b, page_base, page);
        ok = phys >= 0;
        if (ok) {
          const int64_t at = p.pages.row(phys, kvh, t - page * P) + part * VEC;
          Vec16<KT>::to_float(__ldg(reinterpret_cast<const uint4*>(kbase + at)), kf);
          Vec16<KT>::to_float(__ldg(reinterpret_cast<const uint4*>(vbase + at)), vf);
        }
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        Ks[c * L::KS + part * VEC + e] = ok ? kf[e] : 0.f;
        Vs[c * D + part * VEC + e] = ok ? vf[e] : 0.f;  // P is 0 there, but 0 * garbage may be NaN
      }
      if (part == 0) key_ok[c] = ok;
    }
    __syncthreads();

    float S[kRowsPerThread][kColsPerThread];
    tile_scores<D>(Qs, Ks, ty, tx, S);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = ty * kRowsPerThread + i;
      const int32_t qp = row_pos[row];
      float mx = m[i];
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const int c = tx + 8 * j;
        if (!key_ok[c] || kt0 + c > qp) S[i][j] = kNegInf;  // causal, and past the range
        mx = fmaxf(mx, S[i][j]);
      }
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      if (mx == kNegInf) {  // nothing visible for this row yet
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) Ps[row * L::PS + tx + 8 * j] = 0.f;
        continue;
      }
      const float alpha = exp2f(m[i] - mx);
      m[i] = mx;
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        const float pj = exp2f(S[i][j] - mx);
        Ps[row * L::PS + tx + 8 * j] = pj;
        part += pj;
      }
      lsum[i] = lsum[i] * alpha + part;  // this lane's columns; lanes are summed at the end
#pragma unroll
      for (int c = 0; c < DC; ++c) O[i][c] *= alpha;
    }
    __syncthreads();
    tile_pv<D>(Ps, Vs, ty, tx, O);
  };

  auto attend_range = [&](int32_t rs, int32_t re) {
    for (int32_t kt0 = rs; kt0 < re; kt0 += kKeys) attend_tile(kt0, re);
  };

  const int32_t limit = min(max_pos + 1, kv_len);
  if (p.sel_heads < 0) {
    attend_range(0, limit);
  } else {
    QueryToken qt;
    qt.tok = qo0 + q0;
    qt.b = b;
    qt.local = q0;
    const int64_t row = query_row(p, qt) * p.sel_h + row_head(p, h0);
    int32_t begin, end;
    selection_row_range(p, row, begin, end);
    const int32_t n_blocks = ceil_div_d(n_pages, p.k_block_pages);
    const int32_t block_keys = p.k_block_pages * P;
    for (int32_t e = begin; e < end; ++e) {
      const int32_t j = selected_block(p, row, begin, e, n_blocks);
      if (j < 0) continue;
      const int32_t rs = j * block_keys;
      if (rs >= limit) break;  // strictly increasing: later blocks are invisible too
      attend_range(rs, min(rs + block_keys, limit));
    }
  }

  // Finalise: sum the lanes' partial row sums, normalise, store.
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    float lt = lsum[i];
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) lt += __shfl_xor_sync(0xffffffffu, lt, o);
    const int row = ty * kRowsPerThread + i;
    if (row >= n_rows) continue;
    const int32_t tok = qo0 + q0 + row / nh;
    const int32_t h = h0 + row % nh;
    const float inv = lt > 0.f ? 1.f / lt : 0.f;  // a row that attended nothing outputs 0
#pragma unroll
    for (int c = 0; c < DC; ++c)
      store_storage(p.out, p.out_dt, (int64_t(tok) * p.hq + h) * D + tx + 8 * c, O[i][c] * inv);
    if (tx == 0 && p.lse)
      p.lse[int64_t(tok) * p.hq + h] = lt > 0.f ? (m[i] + log2f(lt)) * kLn2 : kNegInf;
  }
}

template <class KT, int D>
cudaError_t launch_d(const AttnParams& p, int32_t max_tiles, int32_t tile_tokens,
                     cudaStream_t stream) {
  const size_t smem = PrefillSmem<D>::bytes;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(prefill_kernel<KT, D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(unsigned(max_tiles), unsigned(p.hkv * p.chunks), unsigned(p.batch));
  prefill_kernel<KT, D><<<grid, kThreads, smem, stream>>>(p, tile_tokens);
  return cudaGetLastError();
}

template <class KT>
cudaError_t launch_kt(const AttnParams& p, int32_t max_tiles, int32_t tile_tokens,
                      cudaStream_t stream) {
  switch (p.d) {
    case 8: return launch_d<KT, 8>(p, max_tiles, tile_tokens, stream);
    case 64: return launch_d<KT, 64>(p, max_tiles, tile_tokens, stream);
    case 128: return launch_d<KT, 128>(p, max_tiles, tile_tokens, stream);
    default: return cudaErrorInvalidValue;  // the host refuses other head dims first
  }
}

}  // namespace

cudaError_t launch_prefill_attention(const AttnParams& p, Storage kv_dt, int32_t max_tiles,
                                     int32_t tile_tokens, cudaStream_t stream) {
  return dispatch_cuda_storage(kv_dt, [&](auto t) {
    return launch_kt<typename decltype(t)::type>(p, max_tiles, tile_tokens, stream);
  });
}

}  // namespace sieve::kernels::cuda
