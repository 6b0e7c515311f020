// Where a token's head_dim row lives in a paged K/V tensor: the one reading of an ABI 1.1 view's
// strides and byte_offset that every reader of pages (kernels, selection, packing, references,
// plugins, CPU and CUDA) goes through.
//
// A view's k_pages / v_pages are shaped [page_capacity, n_kv_heads, page_size, head_dim]; the
// physical layout is in the DLTensor's strides (elements, head_dim stride 1) and byte_offset
// (api/sieve/kv_store.h): compact HND, NHD, or one half of a combined [num_pages, 2, ...] pool.
// A reader takes PageStrides from page_strides() (checked once per call, on the host) and
// addresses row (physical page, KV head, token) as data_ptr(t) + strides.row(...): for compact HND
// the old ((page*H + head)*P + token)*D, the same three multiply(-add)s; strides are runtime values.
//
// Header-only, ABI + standard library only, and host/device neutral: a .cu file may keep a
// PageStrides in its kernel parameters and call row() on the device.
#pragma once
#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>

#include "sieve/kv_store.h"
#include "sieve/util/tensor.hpp"

#if defined(__CUDACC__)
#define SIEVE_PAGE_LAYOUT_HD __host__ __device__
#else
#define SIEVE_PAGE_LAYOUT_HD
#endif

namespace sieve {

// Element strides of a page tensor; head_dim's is 1. A stride of a dimension of size 1 is never
// multiplied by anything but 0.
struct PageStrides {
  int64_t page = 0;   // between physical pages
  int64_t head = 0;   // between the KV heads of a page
  int64_t token = 0;  // between the tokens of a page

  // Element offset (from data_ptr) of the head_dim row of (physical page, KV head, token).
  SIEVE_PAGE_LAYOUT_HD constexpr int64_t row(int64_t phys, int64_t kv_head, int64_t tok) const {
    return phys * page + kv_head * head + tok * token;
  }
  // True when the tokens of one (page, KV head) are one run of tokens x head_dim elements, so a
  // reader may load them in one go (compact HND).
  SIEVE_PAGE_LAYOUT_HD constexpr bool slab_contiguous(int64_t head_dim) const {
    return token == head_dim;
  }
  friend constexpr bool operator==(const PageStrides& a, const PageStrides& b) {
    return a.page == b.page && a.head == b.head && a.token == b.token;
  }
};

// Compact HND strides of a [*, n_kv_heads, page_size, head_dim] tensor (what strides == NULL means).
constexpr PageStrides compact_hnd_strides(int64_t n_kv_heads, int64_t page_size, int64_t head_dim) {
  return {n_kv_heads * page_size * head_dim, page_size * head_dim, head_dim};
}

// One physical layout of a page pool (kv_store.h): a sieve_kv_layout_bits value and, for
// COMBINED, whether each half is HND inside (else NHD), as sieve_kv_pages says it.
struct KvLayout {
  uint32_t bit = SIEVE_KV_LAYOUT_HND;
  bool combined_hnd = false;
};
// Every layout an engine may hand (HND, NHD, combined NHD, combined HND).
inline constexpr KvLayout kKvLayouts[] = {{SIEVE_KV_LAYOUT_HND, false},
                                          {SIEVE_KV_LAYOUT_NHD, false},
                                          {SIEVE_KV_LAYOUT_COMBINED, false},
                                          {SIEVE_KV_LAYOUT_COMBINED, true}};
inline const char* kv_layout_name(KvLayout l) {
  if (l.bit == SIEVE_KV_LAYOUT_HND) return "HND";
  if (l.bit == SIEVE_KV_LAYOUT_NHD) return "NHD";
  if (l.bit == SIEVE_KV_LAYOUT_COMBINED) return l.combined_hnd ? "combined HND" : "combined NHD";
  return "unknown layout";
}

// The strides of views over a pool kept in layout `l`, pages of n_kv_heads x page_size x
// head_dim. K starts at the pool's data; in a combined pool V starts one K page (H*P*D elements)
// later, with the same strides (kv_store.h). Zero strides for an unknown layout value.
constexpr PageStrides layout_strides(KvLayout l, int64_t n_kv_heads, int64_t page_size,
                                     int64_t head_dim) {
  const int64_t page = n_kv_heads * page_size * head_dim;
  const PageStrides hnd = compact_hnd_strides(n_kv_heads, page_size, head_dim);
  const PageStrides nhd{page, head_dim, n_kv_heads * head_dim};
  if (l.bit == SIEVE_KV_LAYOUT_HND) return hnd;
  if (l.bit == SIEVE_KV_LAYOUT_NHD) return nhd;
  if (l.bit == SIEVE_KV_LAYOUT_COMBINED) {
    PageStrides s = l.combined_hnd ? hnd : nhd;
    s.page = 2 * page;
    return s;
  }
  return {};
}

namespace page_layout_detail {
inline std::string strides_text(const DLTensor& t) {
  std::string s = "[";
  for (int i = 0; i < 4; ++i) s += (i ? ", " : "") + std::to_string(stride(t, i));
  return s + "]";
}
}  // namespace page_layout_detail

// The strides of a 4-dim page tensor whose shape and dtype the caller has checked, with what
// every reader relies on: head_dim stride 1; byte_offset a whole number of elements; the strides
// of dimensions longer than 1 positive; no two (KV head, token) rows of a page overlapping; and
// each page inside its page stride, so page_capacity pages are page_capacity disjoint slots from
// data_ptr (the bounds of the pool). Returns "" (and *out) or one line that starts with `name`.
inline std::string page_strides(const DLTensor& t, const char* name, PageStrides* out) {
  using page_layout_detail::strides_text;
  const std::string n = name;
  if (t.ndim != 4 || !t.shape) return n + ": expected a 4-dim page tensor [page_capacity, n_kv_heads, page_size, head_dim]";
  const int64_t cap = t.shape[0], H = t.shape[1], P = t.shape[2], D = t.shape[3];
  const PageStrides s{stride(t, 0), stride(t, 1), stride(t, 2)};
  const size_t elem = dtype_bytes(t.dtype);
  if (D > 1 && stride(t, 3) != 1)
    return n + ": head_dim stride " + std::to_string(stride(t, 3)) +
           ", expected 1 (each token's head_dim row is contiguous; strides " + strides_text(t) + ")";
  if (elem == 0 || t.byte_offset % elem != 0)
    return n + ": byte_offset " + std::to_string(t.byte_offset) + " is not a whole number of " +
           std::to_string(elem) + "-byte elements";
  const char* dim_names[3] = {"page", "KV head", "token"};
  const int64_t sizes[3] = {cap, H, P}, values[3] = {s.page, s.head, s.token};
  for (int i = 0; i < 3; ++i)
    if (sizes[i] > 1 && values[i] < 1)
      return n + ": " + dim_names[i] + " stride " + std::to_string(values[i]) +
             ", expected > 0 (strides " + strides_text(t) + ")";
  // Rows of a page: the smaller of the head / token strides must clear a row (D elements), the
  // larger must clear all the rows of the smaller (the DLPack sizes bound the values: no overflow
  // before the multiplications below, which are checked against the page extent).
  struct Axis {
    int64_t stride, count;
  };
  Axis lo{H > 1 ? s.head : 0, H > 1 ? H : 1}, hi{P > 1 ? s.token : 0, P > 1 ? P : 1};
  if (lo.count == 1 || (hi.count > 1 && hi.stride < lo.stride)) std::swap(lo, hi);
  const bool rows_ok = (lo.count == 1 || lo.stride >= D) &&
                       (hi.count == 1 || hi.stride >= (lo.count == 1 ? D : lo.stride * lo.count));
  if (!rows_ok)
    return n + ": strides " + strides_text(t) + " overlap the rows of a page (KV head stride " +
           std::to_string(s.head) + ", token stride " + std::to_string(s.token) + ", head_dim " +
           std::to_string(D) + ")";
  constexpr int64_t kMaxSpan = int64_t(1) << 56;  // elements; far past any pool, far from overflow
  const int64_t extent = (H > 1 ? (H - 1) * s.head : 0) + (P > 1 ? (P - 1) * s.token : 0) + D;
  if (cap > 1 && s.page < extent)
    return n + ": page stride " + std::to_string(s.page) + " is smaller than one page (" +
           std::to_string(extent) + " elements: pages overlap; strides " + strides_text(t) + ")";
  if (cap > 1 && s.page > (kMaxSpan - extent) / (cap - 1))
    return n + ": " + std::to_string(cap) + " pages of stride " + std::to_string(s.page) +
           " elements are out of bounds of any pool";
  *out = s;
  return {};
}

// Elements from data_ptr(t) to one past the last row of the pool t (strides from page_strides):
// what a copy of the whole pool must cover.
inline int64_t page_span(const DLTensor& t, const PageStrides& s) {
  const int64_t cap = t.shape[0], H = t.shape[1], P = t.shape[2], D = t.shape[3];
  if (cap == 0 || H == 0 || P == 0 || D == 0) return 0;
  return (cap - 1) * s.page + (H - 1) * s.head + (P - 1) * s.token + D;
}

// K and V of a view (shapes checked by the caller): each as above, and one layout for both (a
// combined pool gives them the same strides and different byte_offsets). "" or one line.
inline std::string view_page_strides(const sieve_paged_kv& kv, PageStrides* out) {
  PageStrides k, v;
  if (std::string e = page_strides(kv.k_pages, "kv.k_pages", &k); !e.empty()) return e;
  if (std::string e = page_strides(kv.v_pages, "kv.v_pages", &v); !e.empty()) return e;
  if (!(k == v))
    return "kv.v_pages: strides " + page_layout_detail::strides_text(kv.v_pages) +
           " differ from kv.k_pages " + page_layout_detail::strides_text(kv.k_pages) +
           " (K and V of a view share one layout)";
  *out = k;
  return {};
}

}  // namespace sieve
