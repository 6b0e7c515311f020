// Page statistics (decode): page_mass[page, column] = Σ over the page's tokens t of
// max over the column's query heads h of p_h(t), p_h(t) = exp(scale q_h·k_t − lse_h), where a head
// that did not attend the page (its selection row skips the page's key block) contributes 0.
//
// A second pass after attention, since it needs the final lse. Grid (logical page, work row): one
// CTA per page of a computed row's sequence; a thread per token of the page (up to
// kTokensPerThread tokens per thread), the group's queries in shared memory (broadcast reads),
// the token's K row read with 16-byte loads. Pages nobody computed keep the 0 the host wrote
// before the launch.
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
      qs[i] = load_elem(p.q, p.q_dt, (int64_t(tok) * p.hq + h) * D + i % D) * p.scale_log2;
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
      const KT* krow = kbase + ((int64_t(phys) * p.hkv + kvh) * P + t) * D;
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

cudaError_t launch_page_mass(const AttnParams& p, int kv_dt, int32_t max_pages,
                             cudaStream_t stream) {
  switch (kv_dt) {
    case kDtF32: return launch_kt<float>(p, max_pages, stream);
    case kDtF16: return launch_kt<__half>(p, max_pages, stream);
    default: return launch_kt<__nv_bfloat16>(p, max_pages, stream);
  }
}

}  // namespace sieve::kernels::cuda
