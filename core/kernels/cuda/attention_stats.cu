// Page statistics (decode): page_mass[page, column] = Σ over the page's tokens t of
// max over the column's query heads h of p_h(t), p_h(t) = exp(scale q_h·k_t − lse_h), where a head
// that did not attend the page (its selection row skips the page's key block) contributes 0.
//
// p_h(t) needs the final lse, so the reduction runs after attention, in one of two ways:
//   - from logits (tensor-core path): the row kernel stored every logit it computed in the
//     attention pass (AttnParams::logits); page_mass_logits_kernel reads them (4 bytes per token
//     and head) and the lse. Grid (page chunk, work row): a thread per token of the chunk's pages,
//     then a warp per page sums its tokens (fixed order: deterministic). This is the path of
//     DELTA's Δ-layers: the K cache is read once, by the attention itself.
//   - from K (FMA path): page_mass_kernel recomputes q·k. Grid (logical page, work row): one CTA
//     per page of a computed row's sequence; a thread per token of the page (up to
//     kTokensPerThread tokens per thread), the group's queries in shared memory (broadcast
//     reads), the token's K row read with 16-byte loads.
// Pages nobody computed keep the 0 the host wrote before the launch.
#include <algorithm>

#include "attention_cuda_common.cuh"

namespace sieve::kernels::cuda {
namespace {

constexpr int kTokensPerThread = 4;  // page_size <= 512 (the host refuses larger with stats)

// Is key block j in selection row `row`? Rows are strictly increasing: binary search.
__device__ inline bool row_has_block(const AttnParams& p, int64_t row, int32_t j) {
  int32_t lo, hi;
  selection_row_range(p, row, lo, hi);
  while (lo < hi) {
    const int32_t mid = (lo + hi) >> 1;
    const int32_t v = __ldg(p.sel_indices + mid);
    if (v == j) return true;
    if (v < j) lo = mid + 1;
    else hi = mid;
  }
  return false;
}

__device__ inline float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // scratch is reused across calls
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) s += scratch[w];
  return s;
}

template <class KT, int D>
__global__ void __launch_bounds__(kThreads) page_mass_kernel(const AttnParams p) {
  constexpr int VEC = Vec16<KT>::N;
  extern __shared__ __align__(16) float smem[];
  float* qs = smem;                      // [group][D], log2-domain queries
  float* lse2 = qs + p.group * D;        // [group], log2-domain lse; -inf: head skips the page
  __shared__ float red[kThreads / 32];

  const int32_t r = blockIdx.y;
  int32_t tok = r;
  if (p.q_rows) {
    tok = __ldg(p.q_rows + r);
    if (tok < 0 || tok >= p.n_q_tokens) return;  // recorded by the row kernel
  }
  const QueryToken qt = query_token(p, tok);
  const int32_t page = blockIdx.x;
  if (page >= qt.n_pages) return;
  const int32_t phys = physical_page(p, qt.b, qt.page_base, page);
  if (phys < 0) return;
  const int32_t P = p.page_size;
  const int32_t n_tok = min(P, qt.kv_len - page * P);
  const int32_t block = page / p.k_block_pages;
  const int64_t qrow = p.sel_heads < 0 ? 0 : query_row(p, qt);
  const float* lse = p.lse_all ? p.lse_all : p.lse;
  const KT* kbase = static_cast<const KT*>(p.k);

  float pmax[kTokensPerThread];
#pragma unroll
  for (int i = 0; i < kTokensPerThread; ++i) pmax[i] = 0.f;

  for (int32_t kvh = 0; kvh < p.hkv; ++kvh) {
    __syncthreads();  // the previous KV head's queries are no longer read
    for (int i = threadIdx.x; i < p.group * D; i += kThreads) {
      const int32_t h = kvh * p.group + i / D;
      qs[i] = load_storage(p.q, p.q_dt, (int64_t(tok) * p.hq + h) * D + i % D) * p.scale_log2;
    }
    for (int g = threadIdx.x; g < p.group; g += kThreads) {
      const int32_t h = kvh * p.group + g;
      float l2 = lse[int64_t(tok) * p.hq + h] * kLog2e;
      if (p.sel_heads >= 0 && !row_has_block(p, qrow * p.sel_h + row_head(p, h), block)) l2 = kNegInf;
      lse2[g] = l2;
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kTokensPerThread; ++i) {
      const int32_t t = threadIdx.x + i * kThreads;
      if (t >= n_tok) continue;
      const KT* krow = kbase + p.pages.row(phys, kvh, t);
      float kf[D];
#pragma unroll
      for (int c = 0; c < D / VEC; ++c)
        Vec16<KT>::to_float(__ldg(reinterpret_cast<const uint4*>(krow) + c), kf + c * VEC);
      for (int g = 0; g < p.group; ++g) {
        const float l2 = lse2[g];
        if (l2 == kNegInf) continue;  // the head attended nothing, or not this page
        float s = 0.f;
#pragma unroll
        for (int d = 0; d < D; ++d) s = fmaf(qs[g * D + d], kf[d], s);
        pmax[i] = fmaxf(pmax[i], exp2f(s - l2));
      }
    }

    if (p.stats_h > 1) {  // PER_KV_HEAD: this KV head's column is complete
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < kTokensPerThread; ++i) {
        sum += pmax[i];
        pmax[i] = 0.f;
      }
      sum = block_sum(sum, red);
      if (threadIdx.x == 0) p.page_mass[(int64_t(qt.page_base) + page) * p.stats_h + kvh] = sum;
    }
  }
  if (p.stats_h == 1) {  // ALL_HEADS: the max ran over every KV head's group
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kTokensPerThread; ++i) sum += pmax[i];
    sum = block_sum(sum, red);
    if (threadIdx.x == 0) p.page_mass[int64_t(qt.page_base) + page] = sum;
  }
}

// Pages of one page_mass_logits_kernel CTA: about kLogitTokens tokens, and at most
// kLogitMaxFlags (page, head) flags of a sparse selection.
constexpr int kLogitTokens = 256;
constexpr int kLogitMaxFlags = 16384;
constexpr int kHeadBatch = 8;  // logit loads a thread issues before using them

int32_t logit_pages_per_cta(int32_t page_size, int32_t hq) {
  int32_t ppc = std::max(1, kLogitTokens / page_size);
  while (ppc > 1 && int64_t(ppc) * hq > kLogitMaxFlags) ppc /= 2;
  return ppc;
}

__global__ void __launch_bounds__(kThreads) page_mass_logits_kernel(const AttnParams p, int32_t ppc) {
  extern __shared__ __align__(16) float smem[];
  const int32_t P = p.page_size;
  float* lse2 = smem;                                  // [hq] log2-domain lse; -inf: head attended nothing
  float* vals = lse2 + ((p.hq + 3) & ~3);              // [ppc * P]: token scores of one column
  unsigned char* skip = reinterpret_cast<unsigned char*>(vals + ppc * P);  // [ppc][hq], sparse only

  const int32_t r = blockIdx.y;
  int32_t tok = r;
  if (p.q_rows) {
    tok = __ldg(p.q_rows + r);
    if (tok < 0 || tok >= p.n_q_tokens) return;  // recorded by the row kernel
  }
  const QueryToken qt = query_token(p, tok);
  const int32_t page0 = int32_t(blockIdx.x) * ppc;
  if (page0 >= qt.n_pages) return;
  const int32_t n_pg = min(ppc, qt.n_pages - page0);
  const float* lse = p.lse_all ? p.lse_all : p.lse;
  for (int h = threadIdx.x; h < p.hq; h += kThreads) lse2[h] = lse[int64_t(tok) * p.hq + h] * kLog2e;
  const bool sparse = p.sel_heads >= 0;
  if (sparse) {
    // A head whose selection row skips the page's key block contributes 0 (its logits there were
    // never written).
    const int64_t qrow = query_row(p, qt);
    for (int i = threadIdx.x; i < n_pg * p.hq; i += kThreads) {
      const int32_t page = page0 + i / p.hq, h = i % p.hq;
      skip[i] = !row_has_block(p, qrow * p.sel_h + row_head(p, h), page / p.k_block_pages);
    }
  }
  __syncthreads();

  const int64_t head_stride = int64_t(qt.n_pages) * P;
  const float* lg = p.logits + int64_t(qt.page_base) * P * p.hq;
  const int32_t n_tok = n_pg * P;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int32_t c = 0; c < p.stats_h; ++c) {
    const int32_t h_begin = p.stats_h == 1 ? 0 : c * p.group;
    const int32_t h_end = p.stats_h == 1 ? p.hq : h_begin + p.group;
    for (int32_t i = threadIdx.x; i < n_tok; i += kThreads) {
      const int32_t pos = page0 * P + i;
      float v = 0.f;
      if (pos < qt.kv_len) {
        const unsigned char* sk = skip + (i / P) * p.hq;
        // kHeadBatch independent loads in flight before their use (the loop is latency-bound
        // otherwise); a skipped head's value is loaded but not used.
        for (int32_t hb = h_begin; hb < h_end; hb += kHeadBatch) {
          float x[kHeadBatch];
#pragma unroll
          for (int j = 0; j < kHeadBatch; ++j)
            x[j] = hb + j < h_end ? __ldg(lg + (hb + j) * head_stride + pos) : kNegInf;
#pragma unroll
          for (int j = 0; j < kHeadBatch; ++j) {
            const int32_t h = hb + j;
            if (h >= h_end) break;
            const float l2 = lse2[h];
            if (l2 == kNegInf || (sparse && sk[h])) continue;
            v = fmaxf(v, exp2f(x[j] - l2));
          }
        }
      }
      vals[i] = v;
    }
    __syncthreads();
    for (int32_t pg = warp; pg < n_pg; pg += kThreads / 32) {
      float sum = 0.f;
      for (int32_t t = lane; t < P; t += 32) sum += vals[pg * P + t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) p.page_mass[(int64_t(qt.page_base) + page0 + pg) * p.stats_h + c] = sum;
    }
    __syncthreads();  // vals is rewritten for the next column
  }
}

template <class KT, int D>
cudaError_t launch_d(const AttnParams& p, int32_t max_pages, cudaStream_t stream) {
  const size_t smem = padded_smem_floats(size_t(p.group) * (D + 1));
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(page_mass_kernel<KT, D>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(unsigned(max_pages), unsigned(p.n_work));
  page_mass_kernel<KT, D><<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <class KT>
cudaError_t launch_kt(const AttnParams& p, int32_t max_pages, cudaStream_t stream) {
  switch (p.d) {
    case 8: return launch_d<KT, 8>(p, max_pages, stream);
    case 64: return launch_d<KT, 64>(p, max_pages, stream);
    case 128: return launch_d<KT, 128>(p, max_pages, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_page_mass_from_logits(const AttnParams& p, int32_t max_pages, cudaStream_t stream) {
  if (!p.logits) return cudaErrorInvalidValue;
  const int32_t ppc = logit_pages_per_cta(p.page_size, p.hq);
  const size_t floats = size_t((p.hq + 3) & ~3) + size_t(ppc) * p.page_size;
  const size_t flags = p.sel_heads >= 0 ? size_t(ppc) * p.hq : 0;
  const size_t smem = padded_smem_floats(floats + (flags + 3) / 4);
  if (smem > 48 * 1024) {  // only for thousands of heads
    cudaError_t e = cudaFuncSetAttribute(page_mass_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(unsigned((max_pages + ppc - 1) / ppc), unsigned(p.n_work));
  page_mass_logits_kernel<<<grid, kThreads, smem, stream>>>(p, ppc);
  return cudaGetLastError();
}

cudaError_t launch_page_mass(const AttnParams& p, Storage kv_dt, int32_t max_pages,
                             cudaStream_t stream) {
  return dispatch_cuda_storage(kv_dt, [&](auto t) {
    return launch_kt<typename decltype(t)::type>(p, max_pages, stream);
  });
}

}  // namespace sieve::kernels::cuda
