// CPU maintenance of the Quest min/max sidecar and the page bounds (page_bound.hpp).
#include "sieve/selection/page_bound.hpp"

#include <sieve/util/error.hpp>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <string>

#include "bound_rows.hpp"

namespace sieve::selection {

#ifdef SIEVE_SELECTION_X86_FMA
void bound_rows_fma(const float* q, int32_t n_heads, const float* mn, const float* mx, int32_t d,
                    float* out);  // page_bound_fma.cpp
// load_bound_order with AVX2 transposes; false where it does not apply (f16, padded rounds).
bool load_bound_order_avx2(const void* base, DLDataType t, int64_t off, int32_t d, float* dst);
#endif

namespace {

bool has_avx2_fma() {
#ifdef SIEVE_SELECTION_X86_FMA
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

// bound_rows_impl vectorized with hardware FMA where the CPU has them (same bits).
using BoundRows = void (*)(const float*, int32_t, const float*, const float*, int32_t, float*);
BoundRows bound_rows() {
#ifdef SIEVE_SELECTION_X86_FMA
  static const BoundRows f = has_avx2_fma() ? bound_rows_fma : bound_rows_impl;
  return f;
#else
  return bound_rows_impl;
#endif
}

// The strides of [capacity, n_kv_heads, page_size, head_dim] CPU K pages (any layout
// page_strides accepts).
PageStrides k_strides(const DLTensor& k) {
  require(k.data && k.ndim == 4 && k.device.device_type == kDLCPU, SIEVE_ERR_INVALID_ARGUMENT,
          "page bound: K pages must be a 4-d CPU tensor");
  PageStrides at;
  const std::string e = page_strides(k, "page bound: K pages", &at);
  require(e.empty(), SIEVE_ERR_INVALID_ARGUMENT, e);
  return at;
}

// K pages (k_strides) and a compact [capacity, n_kv_heads, 2*head_dim] CPU sidecar of their
// dtype; returns the pages' strides.
PageStrides check_pair(const sieve_paged_kv& view, const DLTensor& sidecar) {
  const DLTensor& k = view.k_pages;
  const PageStrides at = k_strides(k);
  require(sidecar.data && sidecar.ndim == 3 && is_contiguous(sidecar) &&
              sidecar.device.device_type == kDLCPU && sidecar.shape[0] >= k.shape[0] &&
              sidecar.shape[1] == k.shape[1] && sidecar.shape[2] == 2 * k.shape[3],
          SIEVE_ERR_INVALID_ARGUMENT,
          "page bound: the min/max sidecar must be a compact CPU [capacity, n_kv_heads, "
          "2 * head_dim] tensor");
  require(same_dtype(sidecar.dtype, k.dtype), SIEVE_ERR_INVALID_ARGUMENT,
          "page bound: sidecar dtype " + dtype_name(sidecar.dtype) + " differs from the K pages' " +
              dtype_name(k.dtype));
  return at;
}

// Heads bounded per call of bound_rows (a group of more is done in pieces).
constexpr int32_t kMaxGroup = 16;
// Threads over a sequence's (page, KV head) items from this many multiply-adds, for head dims
// whose min/max fit a stack buffer.
constexpr int64_t kThreadedWork = int64_t(1) << 20;
constexpr int64_t kMaxThreadedDim = 512;

// load(c) for c < d into bound order (bound_order_floats) at dst.
template <class Load>
void scatter_bound_order(Load load, int32_t d, float* dst) {
  const int32_t lanes = bound_order_lanes(d), round = lanes * kBoundChunk;
  const int64_t n = bound_order_floats(d);
  if (n != d) std::fill(dst, dst + n, 0.0f);
  for (int32_t r0 = 0; r0 < d; r0 += round)
    for (int32_t p = 0; p < lanes; ++p)
      for (int32_t i = 0, c = r0 + p * kBoundChunk; i < kBoundChunk && c < d; ++i, ++c)
        dst[r0 + i * lanes + p] = load(c);
}

// Elements [off, off + d) of a float-storage tensor in bound order, one loop per dtype (no
// dtype test per element); 8x8 transposes in AVX2 where the CPU has them (same floats).
void load_bound_order(const void* base, DLDataType t, int64_t off, int32_t d, float* dst) {
#ifdef SIEVE_SELECTION_X86_FMA
  if (has_avx2_fma() && load_bound_order_avx2(base, t, off, d, dst)) return;
#endif
  if (t.bits == 32) {
    const float* s = static_cast<const float*>(base) + off;
    scatter_bound_order([s](int32_t c) { return s[c]; }, d, dst);
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(base) + off;
  if (t.code == kDLBfloat) scatter_bound_order([s](int32_t c) { return bf16_to_f32(s[c]); }, d, dst);
  else scatter_bound_order([s](int32_t c) { return f16_to_f32(s[c]); }, d, dst);
}

}  // namespace

void minmax_on_append_cpu(const sieve_paged_kv& view, const int32_t* new_tokens,
                          const DLTensor& sidecar) {
  const PageStrides at = check_pair(view, sidecar);
  const DLTensor& k = view.k_pages;
  const int64_t H = k.shape[1], ps = k.shape[2], d = k.shape[3];
  const int32_t* pages = data_ptr<const int32_t>(view.indices);  // CPU view: host-readable
  const void* kb = data_ptr<const void>(k);
  void* sb = data_ptr<void>(sidecar);
  for (int32_t b = 0; b < view.batch; ++b) {
    const int64_t len = int64_t(view.indptr_host[b + 1] - view.indptr_host[b] - 1) * ps +
                        view.last_page_len_host[b];
    const int64_t n_new = new_tokens[b + 1] - new_tokens[b];
    if (n_new <= 0 || view.indptr_host[b + 1] == view.indptr_host[b]) continue;
    require(n_new <= len, SIEVE_ERR_INVALID_ARGUMENT,
            "page bound: sequence " + std::to_string(b) + " has " + std::to_string(n_new) +
                " new tokens but holds " + std::to_string(len));
    for (int64_t first = len - n_new; first < len;) {
      const int64_t logical = first / ps, offset = first % ps;
      const int64_t end = std::min<int64_t>(len, (logical + 1) * ps);
      const int64_t phys = pages[view.indptr_host[b] + logical];
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kbase = at.row(phys, h, 0);
        const int64_t sbase = (phys * H + h) * 2 * d;
        for (int64_t c = 0; c < d; ++c) {
          float mn, mx;
          int64_t t = offset;
          if (offset == 0) {  // the page's first token initialises it (the sidecar was zeroed)
            mn = mx = load_float(kb, k.dtype, kbase + t * at.token + c);
            ++t;
          } else {
            mn = load_float(sb, sidecar.dtype, sbase + c);
            mx = load_float(sb, sidecar.dtype, sbase + d + c);
          }
          for (int64_t tt = t; tt < end - logical * ps; ++tt) {
            const float v = load_float(kb, k.dtype, kbase + tt * at.token + c);
            mn = std::min(mn, v);
            mx = std::max(mx, v);
          }
          // Exact: mn/mx are values of the stored dtype.
          store_float(sb, sidecar.dtype, sbase + c, mn);
          store_float(sb, sidecar.dtype, sbase + d + c, mx);
        }
      }
      first = end;
    }
  }
}

void minmax_recompute_cpu(const sieve_paged_kv& view, int32_t physical_page, int32_t kv_head,
                          int32_t tokens, float* mn, float* mx) {
  const DLTensor& k = view.k_pages;
  const PageStrides at = k_strides(k);
  const int64_t d = k.shape[3];
  const void* kb = data_ptr<const void>(k);
  const int64_t kbase = at.row(physical_page, kv_head, 0);
  for (int64_t c = 0; c < d; ++c) {
    mn[c] = mx[c] = load_float(kb, k.dtype, kbase + c);
    for (int64_t t = 1; t < tokens; ++t) {
      const float v = load_float(kb, k.dtype, kbase + t * at.token + c);
      mn[c] = std::min(mn[c], v);
      mx[c] = std::max(mx[c], v);
    }
  }
}

void page_bounds_cpu(const sieve_paged_kv& view, const DLTensor& sidecar, const DLTensor& q,
                     const int32_t* qo_indptr_host, int32_t n_q_heads, bool group_max,
                     float* scores, ScoreLayout layout, float* scratch) {
  check_pair(view, sidecar);
  const int64_t Hkv = view.k_pages.shape[1], d = view.k_pages.shape[3];
  require(q.data && q.ndim == 3 && q.shape[1] == n_q_heads && q.shape[2] == d &&
              is_contiguous(q) && q.device.device_type == kDLCPU && n_q_heads % Hkv == 0,
          SIEVE_ERR_INVALID_ARGUMENT,
          "page bound: q must be a compact CPU [n_q_tokens, n_q_heads, head_dim] tensor");
  const int64_t G = n_q_heads / Hkv, n = bound_order_floats(int32_t(d));
  const int32_t* pages = data_ptr<const int32_t>(view.indices);
  const void* sb = data_ptr<const void>(sidecar);
  const BoundRows rows = bound_rows();
  float* qb = scratch;                  // [n_q_heads][n]: the sequence's q in bound order
  float* mm0 = scratch + n_q_heads * n;  // [2][n]
  // One (page, KV head): its min and max into mm, the bounds of its group's heads into scores.
  auto page = [&](int64_t j, int64_t kh, float* mm) {
    const int64_t base = (pages[j] * Hkv + kh) * 2 * d;
    load_bound_order(sb, sidecar.dtype, base, int32_t(d), mm);
    load_bound_order(sb, sidecar.dtype, base + d, int32_t(d), mm + n);
    float bounds[kMaxGroup];
    for (int64_t g0 = 0; g0 < G; g0 += kMaxGroup) {  // heads kh * G + g0 ...
      const int32_t count = int32_t(std::min<int64_t>(kMaxGroup, G - g0));
      rows(qb + (kh * G + g0) * n, count, mm, mm + n, int32_t(d), bounds);
      for (int32_t u = 0; u < count && !group_max; ++u)
        scores[j * layout.item_stride + (kh * G + g0 + u) * layout.head_stride] = bounds[u];
      if (group_max) {
        float& best = scores[j * layout.item_stride + kh * layout.head_stride];
        for (int32_t u = 0; u < count; ++u) best = group_max_step(best, bounds[u], g0 + u == 0);
      }
    }
  };
  for (int32_t b = 0; b < view.batch; ++b) {
    const int64_t row = int64_t(qo_indptr_host[b + 1]) - 1;  // the sequence's last query
    if (row < qo_indptr_host[b]) continue;
    for (int64_t h = 0; h < n_q_heads; ++h)
      load_bound_order(data_ptr<const void>(q), q.dtype, (row * n_q_heads + h) * d, int32_t(d),
                       qb + h * n);
    const int64_t j0 = view.indptr_host[b], n_items = (view.indptr_host[b + 1] - j0) * Hkv;
    // Each (page, KV head) writes only its own scores: threads change no bit. Small sequences
    // stay on the calling thread (waking a team costs more than they do).
    const bool threads = d <= kMaxThreadedDim && n_items * G * d >= kThreadedWork;
#pragma omp parallel for schedule(static) if (threads)
    for (int64_t i = 0; i < n_items; ++i) {
      float mm_local[2 * kMaxThreadedDim];
      page(j0 + i / Hkv, i % Hkv, threads ? mm_local : mm0);
    }
  }
}

}  // namespace sieve::selection

namespace sieve::selection {

int32_t check_decode_call(const sieve_layer_call& call, const sieve_geometry& g) {
  auto bad = [](const std::string& m) { fail(SIEVE_ERR_INVALID_ARGUMENT, m); };
  if (call.phase != SIEVE_PHASE_DECODE) bad("phase " + std::to_string(call.phase) + " is not decode");
  if (call.batch < 0 || call.batch > g.max_batch)
    bad("batch = " + std::to_string(call.batch) + " is outside [0, max_batch = " +
        std::to_string(g.max_batch) + "]");
  if (!call.kv_view) bad("the call has no KV view");
  const sieve_paged_kv& view = *call.kv_view;
  if (view.page_size != g.page_size)
    bad("the KV view has page_size " + std::to_string(view.page_size) +
        ", the policy was created for " + std::to_string(g.page_size));
  if (view.batch != call.batch)
    bad("the KV view has " + std::to_string(view.batch) + " sequences, the call has " +
        std::to_string(call.batch));
  if (call.batch > 0 && (!call.kv_len_host || !call.qo_indptr_host || !view.indptr_host ||
                         !view.last_page_len_host || !call.q || !call.qo_indptr))
    bad("q, qo_indptr, kv_len_host or the view's host page table is NULL");
  int32_t max_pages = 0;
  for (int32_t b = 0; b < call.batch; ++b) {
    const int32_t n_new = call.qo_indptr_host[b + 1] - call.qo_indptr_host[b];
    if (n_new != 1)
      bad("decode has one query per sequence, sequence " + std::to_string(b) + " has " +
          std::to_string(n_new));
    const int32_t pages = view.indptr_host[b + 1] - view.indptr_host[b];
    const int64_t tokens = pages == 0 ? 0 : int64_t(pages - 1) * view.page_size + view.last_page_len_host[b];
    if (call.kv_len_host[b] != tokens)
      bad("kv_len_host[" + std::to_string(b) + "] = " + std::to_string(call.kv_len_host[b]) +
          " but the KV view holds " + std::to_string(tokens) + " tokens");
    max_pages = std::max(max_pages, pages);
  }
  return max_pages;
}

}  // namespace sieve::selection
