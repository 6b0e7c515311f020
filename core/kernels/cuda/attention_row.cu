// The row kernel: attention of single query tokens (decode, and the prefill rows listed in
// q_rows) over the paged cache, GQA-aware, with split-KV.
//
// One CTA per (work row, head unit, KV split); the head unit varies fastest in the grid, so the
// CTAs of one row (and one KV head's chunks) run together. A head unit is the set of query heads
// that share a KV head and a selection row: the whole GQA group (chunked by row_heads_per_cta),
// or one head for PER_Q_HEAD selections. The CTA reads each K/V vector of its tokens once from
// global memory (16-byte loads) and applies it to all of the unit's heads, whose queries and
// accumulators sit in registers. The split's pages (an equal share of the visible pages, or of
// the selected key blocks) are resolved a chunk at a time into shared memory, and their tokens
// streamed as one list. Threads: TX = head_dim / (16 / sizeof(storage)) lanes cover one token's
// head_dim; the CTA's 128 / TX lane groups take tokens round robin, U tokens per step (loads in
// flight before the first use), each group keeping an online softmax (log2 domain, f32) per head.
// The lane groups merge through shared memory at the end. With one split the CTA writes out and
// lse; with several it writes a partial state that launch_split_combine() merges by log-sum-exp.
#include "attention_cuda_common.cuh"

namespace sieve::kernels::cuda {
namespace {

constexpr int kPageChunk = 256;  // page slots staged in shared memory at a time
constexpr int kCombineBatch = 8;  // split partials the combine loads at once per thread

template <class KT, int D, int HG>
__global__ void __launch_bounds__(kThreads) row_attention_kernel(const AttnParams p) {
  constexpr int VEC = Vec16<KT>::N;
  constexpr int TX = D / VEC;  // lanes per token
  static_assert(TX >= 1 && 32 % TX == 0, "a token's lanes must tile a warp");
  constexpr int NG = kThreads / TX;  // lane groups
  constexpr int U = HG >= 8 ? 2 : 4;  // tokens per lane group per step
  __shared__ float sm_m[NG][HG];
  __shared__ float sm_l[NG][HG];
  __shared__ __align__(16) float sm_acc[NG][HG][D];
  __shared__ int32_t sm_page[kPageChunk];   // physical id of each page slot of a chunk, -1: skip
  __shared__ int32_t sm_lpage[kPageChunk];  // its logical page

  const int tid = threadIdx.x;
  const int tx = tid % TX;
  const int lg = tid / TX;
  const int32_t units = p.hkv * p.chunks;
  const int32_t r = blockIdx.x / units;
  const int32_t unit = blockIdx.x % units;
  const int32_t split = blockIdx.y;

  int32_t tok;
  if (!row_token(p, r, tid == 0 && unit == 0 && split == 0, &tok)) return;
  const QueryToken qt = query_token(p, tok);
  const auto [kvh, h0, nh] = head_unit(p, unit);

  // Queries of the unit's heads, this lane's slice of head_dim, pre-scaled into the log2 domain.
  float q[HG][VEC];
#pragma unroll
  for (int g = 0; g < HG; ++g)
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      q[g][e] = g < nh ? load_storage(p.q, p.q_dt, (int64_t(tok) * p.hq + h0 + g) * D + tx * VEC + e) *
                             p.scale_log2
                       : 0.f;

  float m[HG], l[HG], acc[HG][VEC];
#pragma unroll
  for (int g = 0; g < HG; ++g) {
    m[g] = kNegInf;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[g][e] = 0.f;
  }

  const KT* kbase = static_cast<const KT*>(p.k);
  const KT* vbase = static_cast<const KT*>(p.v);
  const int P = p.page_size;

  // This split's share of the work, as "virtual page slots": dense, slot v is logical page
  // pb + v of an equal share [pb, pe) of the visible pages; block-sparse, slot v is page
  // v % k_block_pages of the selected block at entry e0 + v / k_block_pages of an equal share
  // [e0, e1) of the row's entries. A chunk of slots is resolved into shared memory (physical id
  // and logical page; -1 for a page past the causal limit, past the sequence, or bad), then its
  // tokens are streamed as one list: no barrier per selected block, and a K/V load waits on a
  // shared-memory read rather than on a dependent global load of its page id.
  int32_t n_slots = 0, pb = 0, e0 = 0, begin = 0, n_blocks = 0;
  int64_t row = 0;
  const int32_t kbp = p.k_block_pages;
  if (p.sel_heads < 0) {
    const int32_t n_pages = ceil_div_d(qt.limit, P);
    const int32_t per = ceil_div_d(n_pages, p.n_splits);
    pb = min(split * per, n_pages);
    n_slots = min(pb + per, n_pages) - pb;
  } else {
    row = query_row(p, qt) * p.sel_h + row_head(p, h0);
    int32_t end;
    selection_row_range(p, row, begin, end);
    n_blocks = ceil_div_d(qt.n_pages, kbp);
    const int32_t per = ceil_div_d(end - begin, p.n_splits);
    e0 = min(begin + split * per, end);
    n_slots = (min(e0 + per, end) - e0) * kbp;
  }

  for (int32_t v0 = 0; v0 < n_slots; v0 += kPageChunk) {
    const int32_t n_chunk = min(kPageChunk, n_slots - v0);
    __syncthreads();  // the previous chunk's slots are no longer read
    for (int i = tid; i < n_chunk; i += kThreads) {
      int32_t lpage = -1, phys = -1;
      if (p.sel_heads < 0) {
        lpage = pb + v0 + i;
      } else {
        const int32_t v = v0 + i;
        const int32_t j = selected_block(p, row, begin, e0 + v / kbp, n_blocks);
        if (j >= 0) lpage = j * kbp + v % kbp;
      }
      if (lpage >= 0 && lpage < qt.n_pages && lpage * P < qt.limit)
        phys = physical_page(p, qt.b, qt.page_base, lpage);
      sm_page[i] = phys;
      sm_lpage[i] = lpage;
    }
    __syncthreads();

    const int32_t n_tok = n_chunk * P;
    for (int32_t base = 0; base < n_tok; base += NG * U) {  // CTA-uniform: full warps shuffle
      uint4 kr[U], vr[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int32_t i = base + lg + u * NG;
        ok[u] = i < n_tok;
        if (ok[u]) {
          const int32_t slot = p.page_shift >= 0 ? i >> p.page_shift : i / P;
          const int32_t off = i - slot * P;
          const int32_t phys = sm_page[slot];
          ok[u] = phys >= 0 && sm_lpage[slot] * P + off < qt.limit;
          if (ok[u]) {
            const int64_t at = p.pages.row(phys, kvh, off) + tx * VEC;
            kr[u] = __ldg(reinterpret_cast<const uint4*>(kbase + at));
            vr[u] = __ldg(reinterpret_cast<const uint4*>(vbase + at));
          }
        }
      }
      float s[U][HG];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float kf[VEC];
        Vec16<KT>::to_float(ok[u] ? kr[u] : make_uint4(0, 0, 0, 0), kf);
#pragma unroll
        for (int g = 0; g < HG; ++g) {
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < VEC; ++e) d = fmaf(q[g][e], kf[e], d);
#pragma unroll
          for (int o = TX / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
          s[u][g] = ok[u] ? d : kNegInf;
        }
      }
#pragma unroll
      for (int g = 0; g < HG; ++g) {
        float mx = m[g];
#pragma unroll
        for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
        if (mx == kNegInf) continue;  // nothing visible yet for this lane group
        const float alpha = exp2f(m[g] - mx);
        m[g] = mx;
        l[g] *= alpha;
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[g][e] *= alpha;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float pu = exp2f(s[u][g] - mx);  // 0 for masked tokens
          l[g] += pu;
          if (ok[u]) {
            float vf[VEC];
            Vec16<KT>::to_float(vr[u], vf);
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[g][e] = fmaf(pu, vf[e], acc[g][e]);
          }
        }
      }
    }
  }

  // Merge the lane groups.
  if (tx == 0) {
#pragma unroll
    for (int g = 0; g < HG; ++g) {
      sm_m[lg][g] = m[g];
      sm_l[lg][g] = l[g];
    }
  }
#pragma unroll
  for (int g = 0; g < HG; ++g)
#pragma unroll
    for (int e = 0; e < VEC; ++e) sm_acc[lg][g][tx * VEC + e] = acc[g][e];
  __syncthreads();

  for (int i = tid; i < nh * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float mx = kNegInf;
    for (int j = 0; j < NG; ++j) mx = fmaxf(mx, sm_m[j][g]);
    float L = 0.f, O = 0.f;
    if (mx != kNegInf) {
      for (int j = 0; j < NG; ++j) {
        const float w = exp2f(sm_m[j][g] - mx);
        L = fmaf(sm_l[j][g], w, L);
        O = fmaf(sm_acc[j][g][d], w, O);
      }
    }
    const int32_t h = h0 + g;
    const float o = L > 0.f ? O / L : 0.f;  // a row that attended nothing outputs 0
    const float lse = L > 0.f ? (mx + log2f(L)) * kLn2 : kNegInf;
    if (p.n_splits == 1) {
      store_storage(p.out, p.out_dt, (int64_t(tok) * p.hq + h) * D + d, o);
      if (d == 0) {
        if (p.lse) p.lse[int64_t(tok) * p.hq + h] = lse;
        if (p.lse_all) p.lse_all[int64_t(tok) * p.hq + h] = lse;
      }
    } else {
      const int64_t slot = (int64_t(split) * p.n_work + r) * p.hq + h;
      p.part_o[slot * D + d] = o;
      if (d == 0) p.part_lse[slot] = lse;
    }
  }
}

// Max / sum over the CTA (kThreads threads); every thread gets the result.
__device__ inline float cta_reduce(float v, bool is_max, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float x = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, x) : v + x;
  }
  __syncthreads();  // scratch is reused across calls
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  v = scratch[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) v = is_max ? fmaxf(v, scratch[w]) : v + scratch[w];
  return v;
}

// Merge the split-KV partial states of one (work row, query head): out = Σ_s w_s o_s / Σ_s w_s,
// w_s = exp(lse_s - max lse). Splits that held nothing have lse -inf (weight 0, their o unread);
// with split_used, only the splits the row used are read.
// The threads share the splits (a long context can have 256): no serial loop over global loads.
__global__ void __launch_bounds__(kThreads) split_combine_kernel(const AttnParams p) {
  extern __shared__ float sm_w[];  // [n_splits]
  __shared__ float red[kThreads / 32];
  pdl_wait();  // launched as a programmatic dependent of the row kernel: its partials are complete
  const int32_t r = blockIdx.x, h = blockIdx.y;
  int32_t tok = r;
  if (p.q_rows) {
    tok = __ldg(p.q_rows + r);
    if (tok < 0 || tok >= p.n_q_tokens) return;  // recorded by the row kernel
  }
  int S = p.n_splits;
  if (p.split_used) {  // the splits the row kernel used for this head's unit (1: it wrote out itself)
    const int32_t unit = (h / p.group) * p.chunks + (h % p.group) / p.hg;
    S = __ldg(p.split_used + int64_t(r) * (p.hkv * p.chunks) + unit);
    if (S <= 1) return;
  }
  const int64_t stride = int64_t(p.n_work) * p.hq;  // between the splits of one (row, head)
  const int64_t at = int64_t(r) * p.hq + h;
  float mx = kNegInf;
  for (int s = threadIdx.x; s < S; s += kThreads) {
    const float v = p.part_lse[s * stride + at];
    sm_w[s] = v;
    mx = fmaxf(mx, v);
  }
  mx = cta_reduce(mx, true, red);
  float sum = 0.f;
  for (int s = threadIdx.x; s < S; s += kThreads) {
    const float w = mx == kNegInf ? 0.f : expf(sm_w[s] - mx);
    sm_w[s] = w;
    sum += w;
  }
  sum = cta_reduce(sum, false, red);  // its barriers also publish sm_w
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int d = threadIdx.x; d < p.d; d += kThreads) {
    // kCombineBatch independent loads in flight, then the sums in split order (the same result
    // as a serial loop, which waited on one L2 round trip per split: ~33 in a row at batch 1).
    const float* src = p.part_o + at * p.d + d;
    float o = 0.f;
    for (int s0 = 0; s0 < S; s0 += kCombineBatch) {
      float v[kCombineBatch];
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) {
        const int s = s0 + u;
        v[u] = s < S && sm_w[s] > 0.f ? __ldg(src + s * stride * p.d) : 0.f;  // an idle split's o is unwritten
      }
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u)
        if (s0 + u < S && sm_w[s0 + u] > 0.f) o = fmaf(sm_w[s0 + u], v[u], o);
    }
    store_storage(p.out, p.out_dt, (int64_t(tok) * p.hq + h) * p.d + d, o * inv);
  }
  if (threadIdx.x == 0) {
    const float lse = sum > 0.f ? mx + logf(sum) : kNegInf;
    if (p.lse) p.lse[int64_t(tok) * p.hq + h] = lse;
    if (p.lse_all) p.lse_all[int64_t(tok) * p.hq + h] = lse;
  }
}

template <class KT, int D, int HG>
cudaError_t launch_hg(const AttnParams& p, cudaStream_t stream) {
  const dim3 grid(unsigned(p.n_work) * unsigned(p.hkv * p.chunks), unsigned(p.n_splits));
  row_attention_kernel<KT, D, HG><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <class KT, int D>
cudaError_t launch_d(const AttnParams& p, cudaStream_t stream) {
  constexpr int kMaxHg = sizeof(KT) == 4 || D < 64 ? 8 : 4;  // row_heads_per_cta
  if (p.hg > kMaxHg) return cudaErrorInvalidConfiguration;
  switch (p.hg) {
    case 1: return launch_hg<KT, D, 1>(p, stream);
    case 2: return launch_hg<KT, D, 2>(p, stream);
    case 3:
    case 4: return launch_hg<KT, D, 4>(p, stream);
    default:
      if constexpr (kMaxHg == 8) return launch_hg<KT, D, 8>(p, stream);
      return cudaErrorInvalidConfiguration;
  }
}

template <class KT>
cudaError_t launch_kt(const AttnParams& p, cudaStream_t stream) {
  switch (p.d) {
    case 8: return launch_d<KT, 8>(p, stream);
    case 64: return launch_d<KT, 64>(p, stream);
    case 128: return launch_d<KT, 128>(p, stream);
    default: return cudaErrorInvalidValue;  // the host refuses other head dims first
  }
}

}  // namespace

cudaError_t launch_row_attention(const AttnParams& p, Storage kv_dt, cudaStream_t stream) {
  return dispatch_cuda_storage(kv_dt, [&](auto t) { return launch_kt<typename decltype(t)::type>(p, stream); });
}

cudaError_t launch_split_combine(const AttnParams& p, cudaStream_t stream) {
  // A programmatic dependent launch: the combine's CTAs may be scheduled while the row kernel
  // finishes (the tensor-core row kernel allows it once its K/V are read); pdl_wait() in the
  // kernel then waits for the row kernel's completion. Captured into CUDA graphs as such an edge.
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(p.n_work), unsigned(p.hq));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = padded_smem_floats(size_t(p.n_splits));
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, split_combine_kernel, p);
}

}  // namespace sieve::kernels::cuda
