// The tensor-core kernel of an attention variant (sieve_attention_variant): q and K/V of one
// 16-bit dtype, head_dim 64 or 128. The structure of the tensor-core prefill kernel
// (attention_prefill_mma.cu: 128 rows = query tokens x the head unit's heads, 4 warps of two m16
// tiles, 64-key tiles double-buffered with cp.async, online softmax in halves of 32 keys through
// softmax_step32); what differs is the key list: the CTA's variant row's spans in order, each in
// whole tiles, and per tile two steps with a barrier between them:
//   meta  threads 0..63 resolve one column each (variant_item: position, K/V row offset, log2
//         bias and count), fetched while the previous tile is still landing, into the stage's
//         column arrays — the gather's dependent loads (packed key -> page -> row) off the
//         critical path, one round per tile instead of a chain per key row;
//   copy  every thread issues the cp.async of its rows' 16-byte pieces from those offsets.
// Logits: scale·q·k in the log2 domain plus the column's bias, -inf past a row's position, a
// packed key's count clipped at what the row sees (only tiles holding such a key pay for it).
#include "attention_mma.cuh"
#include "attention_variant.cuh"

namespace sieve::kernels::cuda {
namespace {

using namespace mma;

constexpr int kRows = kMmaPrefillRows;  // rows (token, head) per CTA
constexpr int kMT = 2;                  // m16 tiles per warp
constexpr int kHalfKeys = kTileKeys / 2;
constexpr int kHB = kHalfKeys / 8;

template <int D>
struct VariantMmaSmem {
  static constexpr int S = smem_stride<D>();
  static constexpr int tile = kTileKeys * S;
  static constexpr size_t q_bytes = size_t(kRows) * S * 2;
  static constexpr size_t kv_bytes = 2 * 2 * size_t(tile) * 2;  // K and V, two stages
  static constexpr size_t off_bytes = 2 * kTileKeys * 8;        // per stage: column K/V offset
  static constexpr size_t col_bytes = 4 * 2 * kTileKeys * 4;    // per stage: position, count, biases
  static constexpr size_t bytes = q_bytes + kv_bytes + off_bytes + col_bytes;
};

// The next non-empty tile after (span si, tile ti) of a row's spans: si = s1 when none is left.
__device__ inline void next_tile(const AttnParams& p, int64_t row, int32_t s1, int32_t limit, int32_t& si,
                                 int32_t& ti, Span& span) {
  if (++ti * kTileKeys < span.end - span.begin) return;
  ti = 0;
  for (++si; si < s1; ++si) {
    span = variant_span(p, row, si, limit);
    if (span.end > span.begin) return;
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 2) variant_mma_kernel(const AttnParams p, int32_t tile_tokens) {
  using L = VariantMmaSmem<D>;
  constexpr int S = L::S;
  constexpr int NB = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);
  T* sk = reinterpret_cast<T*>(smem + L::q_bytes);
  T* sv = sk + 2 * L::tile;
  int64_t* soff = reinterpret_cast<int64_t*>(smem + L::q_bytes + L::kv_bytes);
  int32_t* spos = reinterpret_cast<int32_t*>(soff + 2 * kTileKeys);
  int32_t* scount = spos + 2 * kTileKeys;
  float* slbias = reinterpret_cast<float*>(scount + 2 * kTileKeys);
  float* sbias = slbias + 2 * kTileKeys;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t4 = lane & 3;
  const int32_t b = blockIdx.z;
  const auto [kvh, h0, nh] = head_unit(p, blockIdx.y);
  const int32_t tile = int32_t(gridDim.x) - 1 - int32_t(blockIdx.x);  // latest queries first
  const VariantTile vt = variant_tile(p, b, tile, tile_tokens, h0);
  if (vt.q0 >= vt.q1) return;
  const int32_t n_rows = (vt.q1 - vt.q0) * nh;
  const int32_t min_pos = vt.first_pos + vt.q0;
  const int32_t limit = min(vt.first_pos + vt.q1, vt.kv_len);

  // Q tile, asynchronously with the first K/V tile.
  load_q_tile<T, D, kRows>(p, sq, vt.qo0 + vt.q0, h0, nh, n_rows);
  int32_t qpos[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) qpos[mt][hf] = min_pos + (warp * 32 + mt * 16 + hf * 8 + g) / nh;

  // Column tid (< 64) of tile (span, ti): item ti * 64 + tid, fetched into registers (global loads
  // only, so it is issued before the barrier that frees its stage), then stored into stage st.
  // store returns whether the column needs a per-row look (a key past the tile's first token, or
  // a count some row must clip).
  struct Column {
    SpanItem it;
    float bias;  // without the count: the causal clip replaces the count's share
  };
  auto fetch = [&](const Span& span, int32_t ti) -> Column {
    Column c{{INT32_MAX, 1, -1, 0.f}, 0.f};
    if (tid >= kTileKeys) return c;
    c.it = variant_item(p, span, ti * kTileKeys + tid, b, vt, kvh, limit);
    if (span.packed && p.packed_bias && c.it.pos != INT32_MAX)
      c.bias = __ldg(p.packed_bias + span.begin + ti * kTileKeys + tid) * kLog2e;
    return c;
  };
  auto store = [&](const Column& col, int st) -> bool {
    if (tid >= kTileKeys) return false;
    const int c = st * kTileKeys + tid;
    soff[c] = col.it.off;
    spos[c] = col.it.pos;
    scount[c] = col.it.count;
    slbias[c] = col.it.lbias;
    sbias[c] = col.bias;
    return col.it.pos == INT32_MAX || int64_t(col.it.pos) + col.it.count - 1 > min_pos;
  };
  constexpr int CPR = D / 8;
  constexpr int RPP = kThreads / CPR;
  auto load_copy = [&](int st) {
    T* tk = sk + st * L::tile;
    T* tv = sv + st * L::tile;
    const int c = tid % CPR;
    const T* kbase = static_cast<const T*>(p.k);
    const T* vbase = static_cast<const T*>(p.v);
#pragma unroll
    for (int i = 0; i < kTileKeys / RPP; ++i) {
      const int r = tid / CPR + i * RPP;
      const int64_t off = soff[st * kTileKeys + r];
      const int64_t src = (off >= 0 ? off : 0) + c * 8;
      cp_async16(tk + r * S + c * 8, kbase + src, off >= 0 ? 16 : 0);
      cp_async16(tv + r * S + c * 8, vbase + src, off >= 0 ? 16 : 0);
    }
  };

  float o[kMT][NB][4], m[kMT][2], l[kMT][2];
  init_rows<D, kMT>(o, m, l);

  int32_t s0, s1;
  variant_row_spans(p, vt.row, s0, s1);
  // The tile in flight (si, ti) and the one being consumed; every thread walks them identically.
  int32_t si = s0 - 1, ti = -1;
  Span span{0, 0, 0};
  next_tile(p, vt.row, s1, limit, si, ti, span);
  bool need = false;
  if (si < s1) {
    need = store(fetch(span, ti), 0);
    __syncthreads();
    load_copy(0);
  }
  cp_async_commit();  // with the Q tile
  for (int it = 0; si < s1; ++it) {
    // The next tile's columns are fetched while tile `it` is still landing.
    next_tile(p, vt.row, s1, limit, si, ti, span);
    const Column next = si < s1 ? fetch(span, ti) : Column{};
    cp_async_wait<0>();
    const bool need_mask = __syncthreads_or(need);  // tile `it` landed; tile it - 1 is no longer read
    need = false;
    if (si < s1) {  // CTA-uniform
      need = store(next, (it + 1) & 1);
      __syncthreads();
      load_copy((it + 1) & 1);
    }
    cp_async_commit();
    const int st = it & 1;
    const T* tk = sk + st * L::tile;
    const T* tv = sv + st * L::tile;
    const int32_t* kp = spos + st * kTileKeys;
    const int32_t* kc = scount + st * kTileKeys;
    const float* klb = slbias + st * kTileKeys;
    const float* kb = sbias + st * kTileKeys;
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      const int c0 = half * kHalfKeys;
      softmax_step32<T, D, kMT>(sq, tk, tv, c0, warp, lane, o, m, l, [&](float (&s)[kMT][kHB][4]) {
#pragma unroll
        for (int nb = 0; nb < kHB; ++nb)
#pragma unroll
          for (int e1 = 0; e1 < 2; ++e1) {
            const int cc = c0 + nb * 8 + 2 * t4 + e1;
            const float lb = klb[cc];
            const int32_t pos = kp[cc];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
              for (int hf = 0; hf < 2; ++hf) {
                float& x = s[mt][nb][2 * hf + e1];
                float bias = lb;
                if (need_mask) {
                  if (pos > qpos[mt][hf]) {
                    x = kNegInf;
                    continue;
                  }
                  bias = clipped_lbias(qpos[mt][hf], pos, kc[cc], lb, kb[cc]);
                }
                x = fmaf(x, p.scale_log2, bias);
              }
          }
      });
    }
  }
  cp_async_wait<0>();  // nothing in flight into shared memory when the CTA exits
  store_rows<T, D, kMT>(p, o, m, l, vt.qo0 + vt.q0, h0, nh, n_rows);
}

template <class T, int D>
cudaError_t launch_d(const AttnParams& p, int32_t max_tiles, int32_t tile_tokens, cudaStream_t stream) {
  constexpr size_t smem = VariantMmaSmem<D>::bytes;
  static unsigned long long smem_set = 0;  // devices whose limit is raised
  if (cudaError_t e = allow_dynamic_smem(variant_mma_kernel<T, D>, smem, smem_set); e != cudaSuccess) return e;
  const dim3 grid(unsigned(max_tiles), unsigned(p.hkv * p.chunks), unsigned(p.batch));
  variant_mma_kernel<T, D><<<grid, kThreads, smem, stream>>>(p, tile_tokens);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_variant_attention_mma(const AttnParams& p, Storage kv_dt, int32_t max_tiles,
                                         int32_t tile_tokens, cudaStream_t stream) {
  if (tile_tokens < 1 || tile_tokens * p.hg > kRows) return cudaErrorInvalidConfiguration;
  return dispatch_cuda_storage(kv_dt, [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (std::is_same_v<T, float>) {
      return cudaErrorInvalidValue;  // f32 storage: the FMA variant kernel
    } else {
      switch (p.d) {
        case 64: return launch_d<T, 64>(p, max_tiles, tile_tokens, stream);
        case 128: return launch_d<T, 128>(p, max_tiles, tile_tokens, stream);
        default: return cudaErrorInvalidValue;  // the host plans this kernel for 64 and 128 only
      }
    }
  });
}

}  // namespace sieve::kernels::cuda
