// The FMA kernel of an attention variant (sieve_attention_variant): f32 storage, mixed q/KV
// dtypes and any head_dim up to 256 (the tensor-core kernel, attention_variant_mma.cu, takes
// 16-bit q and K/V at head_dim 64 and 128).
//
// A CTA per (32 query tokens of one row block, query head, sequence), 4 threads per token (each an
// interleaved quarter of the head dimensions, zero-padded to DCAP). The CTA's tokens share one
// variant row; it walks the row's spans in order, TILE items at a time staged in shared memory
// (K and V as f32, the item's position, log2-domain bias and count), and every token runs one
// online softmax (log2 domain, f32) over all of them, masking what is past its position and
// clipping a packed key's count at the keys it sees.
#include "attention_variant.cuh"

namespace sieve::kernels::cuda {
namespace {

constexpr int kRows = kVariantRows;
static_assert(kRows * 4 == kThreads, "4 threads per query token");

template <int DCAP, int TILE>
__global__ void __launch_bounds__(kThreads) variant_kernel(const AttnParams p) {
  constexpr int DPT = DCAP / 4;
  __shared__ float sk[TILE][DCAP];
  __shared__ float sv[TILE][DCAP];
  __shared__ int64_t s_off[TILE];
  __shared__ int32_t s_pos[TILE], s_count[TILE];
  __shared__ float s_lbias[TILE], s_bias[TILE];
  const int tid = threadIdx.x, r = tid / 4, sub = tid % 4;
  const int32_t b = blockIdx.z, h = blockIdx.y, kvh = h / p.group;
  const int32_t tile = int32_t(gridDim.x) - 1 - int32_t(blockIdx.x);  // latest queries first
  const VariantTile t = variant_tile(p, b, tile, kRows, h);
  if (t.q0 >= t.q1) return;  // CTA-uniform
  const int32_t local = t.q0 + r;
  const bool valid = local < t.q1;
  const int32_t qpos = t.first_pos + (valid ? local : t.q0);
  const int32_t limit = min(t.first_pos + t.q1, t.kv_len);  // keys any token of the tile sees

  const int64_t qrow = (int64_t(t.qo0 + (valid ? local : t.q0)) * p.hq + h) * p.d;
  float q[DPT], o[DPT];
#pragma unroll
  for (int x = 0; x < DPT; ++x) {
    const int dim = sub + 4 * x;
    q[x] = dim < p.d ? load_storage(p.q, p.q_dt, qrow + dim) * p.scale_log2 : 0.f;
    o[x] = 0.f;
  }
  float m_run = kNegInf, l_run = 0.f;

  int32_t s0, s1;
  variant_row_spans(p, t.row, s0, s1);
  for (int32_t si = s0; si < s1; ++si) {  // CTA-uniform: every thread reads the same spans
    const Span span = variant_span(p, t.row, si, limit);
    for (int32_t c0 = 0; c0 < span.end - span.begin; c0 += TILE) {
      __syncthreads();  // the previous stage is no longer read
      if (tid < TILE) {
        const SpanItem it = variant_item(p, span, c0 + tid, b, t, kvh, limit);
        s_pos[tid] = it.pos;
        s_off[tid] = it.off;
        s_count[tid] = it.count;
        s_lbias[tid] = it.lbias;
        s_bias[tid] = span.packed && p.packed_bias && it.pos != INT32_MAX
                          ? __ldg(p.packed_bias + span.begin + c0 + tid) * kLog2e
                          : 0.f;
      }
      __syncthreads();
      for (int el = tid; el < TILE * DCAP; el += kThreads) {
        const int k = el / DCAP, dim = el % DCAP;
        const int64_t off = s_off[k];
        const bool ok = off >= 0 && dim < p.d;
        sk[k][dim] = ok ? load_storage(p.k, p.kv_dt, off + dim) : 0.f;  // zeros: P is 0 there,
        sv[k][dim] = ok ? load_storage(p.v, p.kv_dt, off + dim) : 0.f;  // but 0 * NaN is not
      }
      __syncthreads();
      float s[TILE];
      float mx = kNegInf;
#pragma unroll
      for (int k = 0; k < TILE; ++k) {
        float z = 0.f;
#pragma unroll
        for (int x = 0; x < DPT; ++x) z = fmaf(q[x], sk[k][sub + 4 * x], z);
        z += __shfl_xor_sync(0xffffffffu, z, 1);
        z += __shfl_xor_sync(0xffffffffu, z, 2);
        const int32_t kp = s_pos[k];
        s[k] = kp <= qpos ? z + clipped_lbias(qpos, kp, s_count[k], s_lbias[k], s_bias[k]) : kNegInf;
        mx = fmaxf(mx, s[k]);
      }
      const float m_new = fmaxf(m_run, mx);
      if (m_new > kNegInf) {  // else nothing is visible to this token yet
        const float alpha = exp2f(m_run - m_new);
        m_run = m_new;
        float sum = 0.f;
#pragma unroll
        for (int x = 0; x < DPT; ++x) o[x] *= alpha;
#pragma unroll
        for (int k = 0; k < TILE; ++k) {
          const float pk = exp2f(s[k] - m_new);
          sum += pk;
#pragma unroll
          for (int x = 0; x < DPT; ++x) o[x] = fmaf(pk, sv[k][sub + 4 * x], o[x]);
        }
        l_run = l_run * alpha + sum;
      }
    }
  }
  if (!valid) return;
  const float inv = l_run > 0.f ? 1.f / l_run : 0.f;  // nothing visible: 0
#pragma unroll
  for (int x = 0; x < DPT; ++x) {
    const int dim = sub + 4 * x;
    if (dim < p.d) store_storage(p.out, p.out_dt, qrow + dim, o[x] * inv);
  }
  if (sub == 0 && p.lse)
    p.lse[int64_t(t.qo0 + local) * p.hq + h] = l_run > 0.f ? (m_run + log2f(l_run)) * kLn2 : kNegInf;
}

template <int DCAP, int TILE>
cudaError_t launch(const AttnParams& p, int32_t max_tiles, cudaStream_t stream) {
  variant_kernel<DCAP, TILE><<<dim3(unsigned(max_tiles), unsigned(p.hq), unsigned(p.batch)), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_variant_attention(const AttnParams& p, int32_t max_tiles, cudaStream_t stream) {
  // Three widths cover every head dim up to 256 (32 KiB of K/V stage each).
  if (p.d <= 64) return launch<64, 32>(p, max_tiles, stream);
  if (p.d <= 128) return launch<128, 32>(p, max_tiles, stream);
  if (p.d <= kMaxVariantHeadDim) return launch<256, 16>(p, max_tiles, stream);
  return cudaErrorInvalidValue;  // the host refuses larger head dims first
}

}  // namespace sieve::kernels::cuda
