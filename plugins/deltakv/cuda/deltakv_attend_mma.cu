// Stage 3 of deltakv on tensor cores: q and K/V of one 16-bit dtype, head_dim 64 or 128,
// phase2 = on or only (phase2 = off and everything else take the FMA kernel in deltakv_cuda.cu).
//
// The structure is the core's tensor-core prefill kernel (core/kernels/cuda/
// attention_prefill_mma.cu; primitives and the online-softmax step softmax_step32 come from
// attention_mma.cuh, shared with it): a CTA owns 128
// rows = query tokens x the heads of one GQA group chunk (the group shares every K/V tile), 4 warps
// of 32 rows (two m16 tiles), 64-key tiles double-buffered with cp.async, S = Q·Kᵀ and O += P·V by
// mma.sync m16n8k16 with f32 accumulation, online softmax in registers in halves of 32 keys.
// What differs is the key list and the masks:
//   - the CTA's tokens have nondecreasing safe counts and exact starts (both follow the query's
//     block), so its key list is: phase-1 tiles over anchors [0, safe of the last token), then
//     phase-2 tiles over positions [exact start of the first token, last token]; a tile is
//     wholly one phase (phase 1 is padded to whole tiles);
//   - a phase-1 column holds anchor j gathered from the pages by position (K̂/V̂ are not copied)
//     with bias log2(count_j) (count weighting), valid for a row when j < the row's safe count;
//   - a phase-2 column holds position p, valid for a row when its exact start <= p <= its position.
#include "attention_mma.cuh"
#include "cuda/deltakv_cuda.hpp"
#include "cuda/deltakv_mma.hpp"

namespace sieve::deltakv {
namespace {

namespace kc = sieve::kernels::cuda;
using namespace kc::mma;

constexpr int kThreads = kc::kThreads;  // 128: 4 warps
constexpr int kRows = 128;              // rows (token, head) per CTA
constexpr int kMT = 2;                  // m16 tiles per warp
constexpr int kHalfKeys = kTileKeys / 2;
constexpr int kHB = kHalfKeys / 8;
constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
struct MmaSmem {
  static constexpr int S = smem_stride<D>();
  static constexpr int tile = kTileKeys * S;
  static constexpr size_t q_bytes = size_t(kRows) * S * 2;
  static constexpr size_t kv_bytes = 2 * 2 * size_t(tile) * 2;  // K and V, two stages
  static constexpr size_t off_bytes = 2 * kTileKeys * 8;        // per stage: column K/V offset
  static constexpr size_t col_bytes = 2 * kTileKeys * 4;        // per stage: column key id
  static constexpr size_t bias_bytes = 2 * kTileKeys * 4;       // per stage: column bias
  static constexpr size_t span_bytes = 2 * kRows * 4;           // per token: safe, exact start
  static constexpr size_t bytes = q_bytes + kv_bytes + off_bytes + col_bytes + bias_bytes + span_bytes;
};

__device__ inline int32_t kv_len_of(const CudaLaunch& a, int32_t b) {
  const int32_t pages = a.kv_indptr[b + 1] - a.kv_indptr[b];
  return pages > 0 ? (pages - 1) * a.page_size + a.last_page_len[b] : 0;
}
template <class T>
__device__ inline void store_out(const CudaLaunch& a, int64_t i, float x, float y) {
  if (a.out_dt == storage_of_type<T>()) {
    *reinterpret_cast<uint32_t*>(static_cast<T*>(a.out) + i) = pack2<T>(x, y);
  } else {
    store_storage(a.out, a.out_dt, i, x);
    store_storage(a.out, a.out_dt, i + 1, y);
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 2) deltakv_attend_mma(const CudaLaunch a, int32_t hg,
                                                                   int32_t tile_tokens) {
  using L = MmaSmem<D>;
  constexpr int S = L::S;
  constexpr int NB = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = reinterpret_cast<T*>(smem + L::q_bytes);
  T* sv = sk + 2 * L::tile;
  int64_t* soff = reinterpret_cast<int64_t*>(smem + L::q_bytes + L::kv_bytes);
  int32_t* scol = reinterpret_cast<int32_t*>(soff + 2 * kTileKeys);
  float* sbias = reinterpret_cast<float*>(scol + 2 * kTileKeys);
  int32_t* ssafe = reinterpret_cast<int32_t*>(sbias + 2 * kTileKeys);
  int32_t* sexact = ssafe + kRows;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int32_t b = blockIdx.z;
  const int32_t group = a.hq / a.hkv, chunks = group / hg;
  const int32_t kvh = int32_t(blockIdx.y) / chunks;
  const int32_t h0 = kvh * group + (int32_t(blockIdx.y) % chunks) * hg;
  const int32_t nh = hg;
  const int32_t q_begin = a.qo_indptr[b], n_new = a.qo_indptr[b + 1] - q_begin;
  const int32_t tile = int32_t(gridDim.x) - 1 - int32_t(blockIdx.x);  // latest queries first
  const int32_t t0 = tile * tile_tokens;
  if (t0 >= n_new) return;
  const int32_t t1 = min(t0 + tile_tokens, n_new);
  const int32_t n = kv_len_of(a, b);
  const int32_t first_pos = n - n_new;
  const int32_t n_rows = (t1 - t0) * nh;
  const int64_t seq = int64_t(b) * a.hkv + kvh;
  const int32_t m = a.n_anchors[seq];
  const int32_t* anchor = a.anchor + seq * a.max_seq_len;
  const int32_t* reach = a.reach + seq * a.max_seq_len;
  const bool phase1_on = a.attend.phase2 != kPhase2Only;
  const bool count_weighting = a.attend.count_weighting != 0;

  // Q tile (row = token * nh + head), asynchronously with the first K/V tile.
  {
    constexpr int CPR = D / 8;
    const T* qbase = static_cast<const T*>(a.q);
    for (int i = tid; i < kRows * CPR; i += kThreads) {
      const int row = i / CPR, c = i % CPR;
      const bool ok = row < n_rows;
      const int64_t src = ok ? (int64_t(q_begin + t0 + row / nh) * a.hq + h0 + row % nh) * D + c * 8 : 0;
      cp_async16(sq + row * S + c * 8, qbase + src, ok ? 16 : 0);
    }
  }
  // Each token's span (safe anchors, exact start): nondecreasing along the tile's tokens.
  for (int32_t i = tid; i < t1 - t0; i += kThreads) {
    const RowSpan span = row_span(reach, m, first_pos + t0 + i, a.attend.q_block);
    ssafe[i] = phase1_on ? span.safe : 0;
    sexact[i] = span.exact_begin;
  }
  __syncthreads();
  const int32_t n_anchor_keys = ssafe[t1 - t0 - 1];
  const int32_t exact_min = sexact[0], pos_max = first_pos + t1 - 1;
  const int32_t p1_tiles = kc::ceil_div_d(n_anchor_keys, kTileKeys);
  const int32_t n_tiles = p1_tiles + kc::ceil_div_d(pos_max - exact_min + 1, kTileKeys);

  // This lane's rows: warp rows 32 * warp + 16 * mt + 8 * hf + g.
  int32_t rpos[kMT][2], rsafe[kMT][2], rexact[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = warp * 32 + mt * 16 + hf * 8 + g;
      if (row < n_rows) {
        const int lt = row / nh;
        rpos[mt][hf] = first_pos + t0 + lt;
        rsafe[mt][hf] = ssafe[lt];
        rexact[mt][hf] = sexact[lt];
      } else {
        rpos[mt][hf] = -1;
        rsafe[mt][hf] = 0;
        rexact[mt][hf] = INT32_MAX;
      }
    }

  // Tile i into stage st, in two steps with a barrier between them:
  //  meta: threads 0..63 resolve one column each — phase 1: anchor j (id j, bias log2 count_j,
  //        page from stage 2's anchor_page), phase 2: position p (id p, page from the page
  //        table) — into the stage's column arrays: one round of independent loads per tile
  //        instead of a chain of dependent ones per key row;
  //  copy: every thread issues the cp.async of its rows' 16-byte pieces from those offsets.
  // Absent or unreadable keys get id INT32_MAX and zero K/V (a NaN there would survive P = 0).
  const int32_t page_base = a.kv_indptr[b];
  const int32_t* anchor_page = a.anchor_page + seq * a.max_seq_len;
  auto load_meta = [&](int32_t i, int st) {
    if (tid >= kTileKeys) return;
    const int r = tid;
    int32_t id = INT32_MAX, pos = -1, page = -1;
    float bias = 0.f;
    if (i < p1_tiles) {
      const int32_t j = i * kTileKeys + r;
      if (j < n_anchor_keys) {
        pos = anchor[j];
        page = anchor_page[j];
        id = j;
        if (count_weighting) bias = log2f(float(reach[j] - pos + 1));
      }
    } else {
      const int32_t p = exact_min + (i - p1_tiles) * kTileKeys + r;
      if (p <= pos_max) {
        const int64_t slot = int64_t(page_base) + p / a.page_size;
        page = slot < a.kv_indices_len ? a.kv_indices[slot] : -1;
        if (page >= a.page_capacity) page = -1;
        pos = id = p;
      }
    }
    if (page < 0) id = INT32_MAX;
    soff[st * kTileKeys + r] =
        page >= 0 ? a.kv_strides.row(page, kvh, pos % a.page_size) : -1;
    scol[st * kTileKeys + r] = id;
    sbias[st * kTileKeys + r] = bias;
  };
  constexpr int CPR = D / 8;
  constexpr int RPP = kThreads / CPR;
  auto load_copy = [&](int st) {
    T* tk = sk + st * L::tile;
    T* tv = sv + st * L::tile;
    const int c = tid % CPR;
    const T* kbase = static_cast<const T*>(a.k);
    const T* vbase = static_cast<const T*>(a.v);
#pragma unroll
    for (int it = 0; it < kTileKeys / RPP; ++it) {
      const int r = tid / CPR + it * RPP;
      const int64_t off = soff[st * kTileKeys + r];
      const int bytes = off >= 0 ? 16 : 0;
      const int64_t src = (off >= 0 ? off : 0) + c * 8;
      cp_async16(tk + r * S + c * 8, kbase + src, bytes);
      cp_async16(tv + r * S + c * 8, vbase + src, bytes);
    }
  };

  float o[kMT][NB][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nb][e] = 0.f;
  float mrun[kMT][2], lrun[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    mrun[mt][0] = mrun[mt][1] = kNegInf;
    lrun[mt][0] = lrun[mt][1] = 0.f;
  }
  const float scale_log2 = a.attend.scale * kLog2e;

  if (n_tiles > 0) {
    load_meta(0, 0);
    __syncthreads();
    load_copy(0);
  }
  cp_async_commit();  // with the Q tile
  for (int32_t it = 0; it < n_tiles; ++it) {
    cp_async_wait<0>();
    __syncthreads();  // tile `it` landed; tile it - 1 (and its column arrays) is no longer read
    if (it + 1 < n_tiles) {  // CTA-uniform
      load_meta(it + 1, (it + 1) & 1);
      __syncthreads();
      load_copy((it + 1) & 1);
    }
    cp_async_commit();
    const int st = it & 1;
    const T* tk = sk + st * L::tile;
    const T* tv = sv + st * L::tile;
    const int32_t* col = scol + st * kTileKeys;
    const float* bias = sbias + st * kTileKeys;
    const bool phase1 = it < p1_tiles;

#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      const int c0 = half * kHalfKeys;
      // S = Q·Kᵀ; logits in the log2 domain with the column's bias, masked per (row, column);
      // then the online softmax and O += P·V (the core's step, attention_mma.cuh).
      softmax_step32<T, D, kMT>(sq, tk, tv, c0, warp, lane, o, mrun, lrun, [&](float (&s)[kMT][kHB][4]) {
#pragma unroll
        for (int nb = 0; nb < kHB; ++nb)
#pragma unroll
          for (int e1 = 0; e1 < 2; ++e1) {
            const int cc = c0 + nb * 8 + 2 * t + e1;
            const int32_t id = col[cc];
            const float bs = bias[cc];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
              for (int hf = 0; hf < 2; ++hf) {
                const bool ok = phase1 ? id < rsafe[mt][hf] : id >= rexact[mt][hf] && id <= rpos[mt][hf];
                float& x = s[mt][nb][2 * hf + e1];
                x = ok ? fmaf(x, scale_log2, bs) : kNegInf;
              }
          }
      });
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lt = lrun[mt][hf];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const int row = warp * 32 + mt * 16 + hf * 8 + g;
      if (row >= n_rows) continue;
      const int32_t tok = q_begin + t0 + row / nh;
      const int32_t h = h0 + row % nh;
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      const int64_t base = (int64_t(tok) * a.hq + h) * D + 2 * t;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb)
        store_out<T>(a, base + nb * 8, o[mt][nb][2 * hf] * inv, o[mt][nb][2 * hf + 1] * inv);
    }
}

template <class T, int D>
cudaError_t launch_d(const CudaLaunch& a, int32_t hg, int32_t tile_tokens, dim3 grid) {
  constexpr size_t smem = MmaSmem<D>::bytes;
  static unsigned long long smem_set = 0;
  if (cudaError_t e = kc::allow_dynamic_smem(deltakv_attend_mma<T, D>, smem, smem_set); e != cudaSuccess)
    return e;
  deltakv_attend_mma<T, D><<<grid, kThreads, smem, static_cast<cudaStream_t>(a.stream)>>>(a, hg, tile_tokens);
  return cudaGetLastError();
}

}  // namespace

bool mma_attend_applies(const CudaLaunch& a) {
  // cp.async copies 16-byte pieces of K/V rows: every row must start on a 16-byte boundary (2-byte
  // elements: base aligned, strides multiples of 8); a pool that does not takes the FMA kernel.
  const bool rows_aligned = (reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v)) % 16 == 0 &&
                            (a.kv_strides.page | a.kv_strides.head | a.kv_strides.token) % 8 == 0;
  return a.kv_dt != Storage::f32 && a.q_dt == a.kv_dt && (a.d == 64 || a.d == 128) &&
         a.attend.phase2 != kPhase2Off && rows_aligned;
}

cudaError_t launch_attend_mma(const CudaLaunch& a) {
  const int32_t group = a.hq / a.hkv;
  int32_t hg = 1;
  for (int32_t c = 8; c >= 1; --c)
    if (group % c == 0) {
      hg = c;
      break;
    }
  const int32_t tile_tokens = kRows / hg;
  const dim3 grid(unsigned((a.max_new + tile_tokens - 1) / tile_tokens), unsigned(a.hkv * (group / hg)),
                  unsigned(a.batch));
  const bool bf16 = a.kv_dt == Storage::bf16;
  if (a.d == 64)
    return bf16 ? launch_d<__nv_bfloat16, 64>(a, hg, tile_tokens, grid) : launch_d<__half, 64>(a, hg, tile_tokens, grid);
  return bf16 ? launch_d<__nv_bfloat16, 128>(a, hg, tile_tokens, grid) : launch_d<__half, 128>(a, hg, tile_tokens, grid);
}

}  // namespace sieve::deltakv
