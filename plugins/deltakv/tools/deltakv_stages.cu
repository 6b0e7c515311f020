// deltakv_stages: times Delta-KV's CUDA stages separately — stages 1-2 (keep mask + pack: the
// "scoring" of this method) and stage 3 (its spans, then the core kernel's attention variant:
// count-weighted attention, sieve::kernels::attend_cuda as the host runs it) — with CUDA events, on one
// sequence of keys with adjacent similarity, paged (page 16, HND), bf16 or f16.
//
// Keys per KV head: x_t = normalize(m + drift_t + noise_t), drift an AR(1) process (rho) — a
// cheap stand-in for long_context.hpp that is fast enough at 256K tokens; the tool prints the
// KV reduction it produced, so a run is read at its measured reduction.
//
// usage: deltakv_stages [--ctx 16384,65536,131072] [--hq 32] [--hkv 8] [--d 128]
//          [--threshold 0.83] [--q-block 64] [--dtype bf16|f16] [--reps 5] [--rho 0.97]
//          [--noise 0.35]
// One line per context: ctx, kv_reduction, pack ms, attention ms, total ms, and the attention's
// rate in TFLOP/s counted on the keys it really attends (phase 1 anchors + phase 2 exact keys).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/deltakv_cuda.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/plugin/attention_variant.hpp"
#include "sieve/util/tensor.hpp"

namespace dk = sieve::deltakv;

namespace {

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::fprintf(stderr, "deltakv_stages: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

std::vector<int32_t> parse_list(const std::string& s) {
  std::vector<int32_t> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(std::atoi(s.substr(i, j - i).c_str()));
    i = j + 1;
  }
  return v;
}

uint16_t to16(float x, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16_rn(x);
    return *reinterpret_cast<uint16_t*>(&h);
  }
  __half h = __float2half_rn(x);
  return *reinterpret_cast<uint16_t*>(&h);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int32_t> ctxs = {16384, 65536, 131072};
  int32_t hq = 32, hkv = 8, d = 128, q_block = 64, reps = 5;
  double threshold = 0.83, rho = 0.97, noise = 0.35;
  bool bf16 = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--ctx") ctxs = parse_list(v);
    else if (a == "--hq") hq = std::atoi(v.c_str());
    else if (a == "--hkv") hkv = std::atoi(v.c_str());
    else if (a == "--d") d = std::atoi(v.c_str());
    else if (a == "--threshold") threshold = std::atof(v.c_str());
    else if (a == "--q-block") q_block = std::atoi(v.c_str());
    else if (a == "--dtype") bf16 = v == "bf16";
    else if (a == "--reps") reps = std::atoi(v.c_str());
    else if (a == "--rho") rho = std::atof(v.c_str());
    else if (a == "--noise") noise = std::atof(v.c_str());
    else {
      std::fprintf(stderr, "deltakv_stages: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if ((d != 64 && d != 128) || hq % hkv || ctxs.empty()) {
    std::fprintf(stderr, "deltakv_stages: d must be 64 or 128, hq a multiple of hkv\n");
    return 2;
  }
  const int32_t P = 16;
  std::printf("# deltakv stages, %s, %dq/%dkv d%d, threshold %.2f, q_block %d, rho %.2f noise %.2f\n",
              bf16 ? "bf16" : "f16", hq, hkv, d, threshold, q_block, rho, noise);
  std::printf("%8s %10s %10s %10s %10s %12s\n", "ctx", "reduction", "pack_ms", "attend_ms", "total_ms",
              "attn_TFLOPs");
  for (int32_t n : ctxs) {
    const int32_t pages = (n + P - 1) / P;
    // Host data: pages [pages, hkv, P, d], q [n, hq, d].
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> k(size_t(pages) * hkv * P * d), v(k.size()), q(size_t(n) * hq * d);
    std::vector<float> mean(size_t(hkv) * d), drift(size_t(hkv) * d), x(static_cast<size_t>(d));
    for (auto& m : mean) m = nd(rng);
    for (auto& m : drift) m = nd(rng);
    const float s = float(std::sqrt(1 - rho * rho));
    for (int32_t t = 0; t < n; ++t)
      for (int32_t h = 0; h < hkv; ++h) {
        double norm = 0;
        for (int32_t i = 0; i < d; ++i) {
          float& dr = drift[size_t(h) * d + i];
          dr = float(rho) * dr + s * nd(rng);
          x[size_t(i)] = mean[size_t(h) * d + i] + dr + float(noise) * nd(rng);
          norm += double(x[size_t(i)]) * x[size_t(i)];
        }
        const float inv = float(std::sqrt(double(d) / norm));
        const size_t off = ((size_t(t / P) * hkv + h) * P + t % P) * d;
        for (int32_t i = 0; i < d; ++i) {
          k[off + i] = to16(x[size_t(i)] * inv, bf16);
          v[off + i] = to16(nd(rng), bf16);
        }
      }
    for (auto& e : q) e = to16(nd(rng), bf16);
    std::vector<int32_t> indices(static_cast<size_t>(pages));
    for (int32_t i = 0; i < pages; ++i) indices[size_t(i)] = i;
    const int32_t qo[2] = {0, n}, kv_indptr[2] = {0, pages}, last[1] = {n - (pages - 1) * P};

    void *dk_, *dv, *dq, *dout;
    int32_t *dqo, *dind, *dindptr, *dlast, *chunk_anchors, *anchor, *reach, *anchor_page, *n_anchors, *count,
        *row_spans, *spans;
    uint8_t* keep;
    CK(cudaMalloc(&dk_, k.size() * 2));
    CK(cudaMalloc(&dv, v.size() * 2));
    CK(cudaMalloc(&dq, q.size() * 2));
    CK(cudaMalloc(&dout, q.size() * 2));
    CK(cudaMalloc(&dqo, 8));
    CK(cudaMalloc(&dindptr, 8));
    CK(cudaMalloc(&dlast, 4));
    CK(cudaMalloc(&dind, size_t(pages) * 4));
    const size_t slots = size_t(hkv) * n;
    const int32_t chunk = 512, chunks = (n + chunk - 1) / chunk;
    CK(cudaMalloc(&keep, slots));
    CK(cudaMalloc(&chunk_anchors, size_t(hkv) * chunks * 4));
    CK(cudaMalloc(&anchor, slots * 4));
    CK(cudaMalloc(&reach, slots * 4));
    CK(cudaMalloc(&anchor_page, slots * 4));
    CK(cudaMalloc(&n_anchors, size_t(hkv) * 4));
    CK(cudaMalloc(&count, slots * 4));
    const int32_t n_rows = (n + q_block - 1) / q_block * hkv;
    CK(cudaMalloc(&row_spans, size_t(n_rows) * 2 * 4));
    CK(cudaMalloc(&spans, size_t(n_rows) * 6 * 4));
    CK(cudaMemcpy(dk_, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dqo, qo, 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dindptr, kv_indptr, 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dlast, last, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dind, indices.data(), size_t(pages) * 4, cudaMemcpyHostToDevice));

    dk::CudaLaunch a{};
    a.qo_indptr = dqo;
    a.kv_indptr = dindptr;
    a.last_page_len = dlast;
    a.kv_indices = dind;
    a.kv_indices_len = pages;
    a.k = dk_;
    a.v = dv;
    a.kv_strides = sieve::compact_hnd_strides(hkv, P, d);
    a.page_capacity = pages;
    a.kv_dt = bf16 ? sieve::Storage::bf16 : sieve::Storage::f16;
    a.batch = 1;
    a.hq = hq;
    a.hkv = hkv;
    a.d = d;
    a.page_size = P;
    a.max_seq_len = n;
    a.layer = 0;
    a.max_kv_len = n;
    a.keep_rule = dk::KeepRule{dk::kDelta, dk::kCos, float(threshold), 0.5, 0, chunk};
    a.keep = keep;
    a.chunk_anchors = chunk_anchors;
    a.anchor = anchor;
    a.reach = reach;
    a.anchor_page = anchor_page;
    a.n_anchors = n_anchors;
    a.stream = nullptr;
    const dk::CudaSpans sp{q_block, dk::kPhase2On, q_block, count, row_spans, spans};

    // Stage 3's call of the core kernel: every tensor on device 0, the variant over the packs.
    const DLDataType dt = bf16 ? sieve::kBF16 : sieve::kF16;
    const DLDevice dev{kDLCUDA, 0};
    int64_t q_shape[3] = {n, hq, d}, two[1] = {2}, one[1] = {1}, n_pages[1] = {pages};
    int64_t pages_shape[4] = {pages, hkv, P, d};
    DLTensor tq = sieve::make_view(dq, dev, dt, 3, q_shape), tout = sieve::make_view(dout, dev, dt, 3, q_shape),
             tqo = sieve::make_view(dqo, dev, sieve::kI32, 1, two);
    sieve_paged_kv kv{};
    kv.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    kv.batch = 1;
    kv.page_size = P;
    kv.k_pages = sieve::make_view(dk_, dev, dt, 4, pages_shape);
    kv.v_pages = sieve::make_view(dv, dev, dt, 4, pages_shape);
    kv.indptr = sieve::make_view(dindptr, dev, sieve::kI32, 1, two);
    kv.indices = sieve::make_view(dind, dev, sieve::kI32, 1, n_pages);
    kv.last_page_len = sieve::make_view(dlast, dev, sieve::kI32, 1, one);
    kv.indptr_host = kv_indptr;
    kv.last_page_len_host = last;
    const sieve::plugin::AttentionVariant var(dev, SIEVE_SEL_PER_KV_HEAD, q_block, n_rows, row_spans, 2 * int64_t(n_rows),
                                              spans, int64_t(slots), anchor, count);
    const sieve_attention_args args = var.args(hq, hkv, d, 0.f, &tq, &tout, &tqo, qo, &kv);

    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    std::vector<float> pack_ms, attend_ms;
    for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
      CK(cudaEventRecord(e0));
      if (const char* e = dk::launch_deltakv_pack(a)) {
        std::fprintf(stderr, "deltakv_stages: %s\n", e);
        return 1;
      }
      CK(cudaEventRecord(e1));
      if (const char* e = dk::launch_deltakv_spans(a, sp, n)) {
        std::fprintf(stderr, "deltakv_stages: %s\n", e);
        return 1;
      }
      std::string err;
      if (sieve::kernels::attend_cuda(args, nullptr, &err) != SIEVE_OK) {
        std::fprintf(stderr, "deltakv_stages: %s\n", err.c_str());
        return 1;
      }
      CK(cudaEventRecord(e2));
      CK(cudaEventSynchronize(e2));
      float t1 = 0, t2 = 0;
      CK(cudaEventElapsedTime(&t1, e0, e1));
      CK(cudaEventElapsedTime(&t2, e1, e2));
      if (r > 0) {
        pack_ms.push_back(t1);
        attend_ms.push_back(t2);
      }
    }
    std::sort(pack_ms.begin(), pack_ms.end());
    std::sort(attend_ms.begin(), attend_ms.end());
    const float pm = pack_ms[pack_ms.size() / 2], am = attend_ms[attend_ms.size() / 2];
    // Reduction and the keys the attention really visits (from the packs on the host).
    std::vector<int32_t> m(static_cast<size_t>(hkv)), hreach;
    CK(cudaMemcpy(m.data(), n_anchors, size_t(hkv) * 4, cudaMemcpyDeviceToHost));
    double anchors = 0, visited = 0;
    for (int32_t h = 0; h < hkv; ++h) {
      anchors += m[size_t(h)];
      hreach.resize(size_t(m[size_t(h)]));
      CK(cudaMemcpy(hreach.data(), reach + size_t(h) * n, hreach.size() * 4, cudaMemcpyDeviceToHost));
      for (int32_t p = 0; p < n; ++p) {
        const dk::RowSpan sp = dk::row_span(hreach.data(), m[size_t(h)], p, q_block);
        visited += double(sp.safe) + double(p - sp.exact_begin + 1);
      }
    }
    const double flops = 4.0 * d * visited * (hq / hkv);
    std::printf("%8d %10.4f %10.3f %10.3f %10.3f %12.1f\n", n, 1.0 - anchors / (double(hkv) * n), pm, am,
                pm + am, flops / (am * 1e-3) / 1e12);
    std::fflush(stdout);
    for (void* p : {dk_, dv, dq, dout, (void*)dqo, (void*)dind, (void*)dindptr, (void*)dlast, (void*)keep,
                    (void*)chunk_anchors, (void*)anchor, (void*)reach, (void*)anchor_page, (void*)n_anchors,
                    (void*)count, (void*)row_spans, (void*)spans})
      cudaFree(p);
  }
  return 0;
}
