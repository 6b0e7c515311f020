// conformance_store_access.hpp: device buffers, view copies and their checks, the reference.
#include "conformance_store_access.hpp"

#include <cmath>
#include <cstring>
#include <set>

#include "sieve/util/error.hpp"
#include "sieve/util/page_layout.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime::store_conform {

DeviceBuffer::DeviceBuffer(HostServices& host, size_t bytes) : host_(host) {
  const sieve_host_services* t = host.table();
  data_ = t->alloc(t->host_ctx, host.device(), std::max<size_t>(bytes, 1), 256);
  require(data_ != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
          "conformance: cannot allocate " + std::to_string(bytes) + " bytes on " + device_name(host.device()));
}
DeviceBuffer::~DeviceBuffer() {
  const sieve_host_services* t = host_.table();
  t->free(t->host_ctx, host_.device(), data_);
}
void DeviceBuffer::upload(const void* src, size_t bytes) {
  std::string err;
  require(host_.copy(data_, host_.device(), src, kCpu, bytes, &err), SIEVE_ERR_DEVICE, err);
}
void DeviceBuffer::download(void* dst, size_t bytes) const {
  std::string err;
  require(host_.copy(dst, kCpu, data_, host_.device(), bytes, &err), SIEVE_ERR_DEVICE, err);
}

namespace {

double element(const std::vector<unsigned char>& bytes, const int64_t* strides, DLDataType t,
               int32_t page, int32_t head, int32_t slot, int32_t dim) {
  const int64_t at = page * strides[0] + head * strides[1] + slot * strides[2] + dim * strides[3];
  return load_float(bytes.data(), t, at);
}

// Copies the bytes a 4-d pool tensor spans (through its strides) to the host; "" or the problem.
std::string copy_pool(HostServices& host, const DLTensor& t, const char* what, const Shape& s,
                      std::vector<unsigned char>* out, int64_t* strides) {
  const std::string w = std::string("view.") + what;
  if (!t.data) return w + ".data is NULL";
  if (t.ndim != 4 || !t.shape) return w + " has " + std::to_string(t.ndim) + " dims, expected 4";
  if (t.device.device_type != s.device.device_type)
    return w + " is on " + device_name(t.device) + ", the store on " + device_name(s.device);
  if (!same_dtype(t.dtype, s.dtype)) return w + " is " + dtype_name(t.dtype) + ", the store holds " + dtype_name(s.dtype);
  const int64_t want[4] = {t.shape[0], s.n_kv_heads, s.page_size, s.head_dim};
  if (t.shape[0] < 1 || t.shape[0] > (int64_t(1) << 24))
    return w + " has " + std::to_string(t.shape[0]) + " pages (expected 1 .. 2^24)";
  for (int i = 1; i < 4; ++i)
    if (t.shape[i] != want[i])
      return w + " shape[" + std::to_string(i) + "] is " + std::to_string(t.shape[i]) + ", expected " +
             std::to_string(want[i]) + " ([pages, n_kv_heads, page_size, head_dim])";
  PageStrides at;  // what every reader of a view relies on (sieve/util/page_layout.hpp)
  if (std::string e = page_strides(t, w.c_str(), &at); !e.empty()) return e;
  strides[0] = at.page;
  strides[1] = at.head;
  strides[2] = at.token;
  strides[3] = 1;
  const size_t bytes = t.byte_offset + size_t(page_span(t, at)) * dtype_bytes(t.dtype);
  std::vector<unsigned char> all(bytes);
  std::string err;
  if (!host.copy(all.data(), kCpu, t.data, t.device, bytes, &err)) return w + ": " + err;
  out->assign(all.begin() + ptrdiff_t(t.byte_offset), all.end());
  return {};
}

// An int32 vector of `n` elements; "" or the problem.
std::string copy_i32(HostServices& host, const DLTensor& t, const char* what, const Shape& s, int64_t n,
                     std::vector<int32_t>* out) {
  const std::string w = std::string("view.") + what;
  out->assign(size_t(n), 0);
  if (n == 0) return {};
  if (!t.data) return w + ".data is NULL";
  if (t.ndim != 1 || !t.shape || t.shape[0] != n)
    return w + " is not a 1-d tensor of " + std::to_string(n) + " elements";
  if (!same_dtype(t.dtype, kI32)) return w + " is " + dtype_name(t.dtype) + ", expected int32";
  if (t.device.device_type != s.device.device_type)
    return w + " is on " + device_name(t.device) + ", the store on " + device_name(s.device);
  if (t.strides && t.strides[0] != 1) return w + " is not contiguous";
  std::string err;
  if (!host.copy(out->data(), kCpu, data_ptr<void>(t), t.device, size_t(n) * 4, &err)) return w + ": " + err;
  return {};
}

}  // namespace

double ViewCopy::k_at(int32_t p, int32_t h, int32_t s, int32_t d) const { return element(k, k_strides, dtype, p, h, s, d); }
double ViewCopy::v_at(int32_t p, int32_t h, int32_t s, int32_t d) const { return element(v, v_strides, dtype, p, h, s, d); }
double ViewCopy::pre_at(int32_t p, int32_t h, int32_t s, int32_t d) const {
  return element(k_pre_rope, pre_strides, dtype, p, h, s, d);
}
std::vector<int32_t> ViewCopy::pages(int32_t b) const {
  return {indices.begin() + indptr[b], indices.begin() + indptr[b + 1]};
}

std::vector<std::string> copy_view(HostServices& host, const sieve_paged_kv& view, const Shape& s,
                                   const std::vector<int32_t>& resident, ViewCopy* out) {
  std::vector<std::string> bad;
  const int32_t B = int32_t(resident.size());
  if (view.batch != B) return {"view.batch is " + std::to_string(view.batch) + ", asked for " + std::to_string(B)};
  if (view.page_size != s.page_size)
    return {"view.page_size is " + std::to_string(view.page_size) + ", configured " + std::to_string(s.page_size)};
  if (!view.indptr_host || !view.last_page_len_host) return {"view.indptr_host / last_page_len_host is NULL"};
  out->batch = B;
  out->page_size = s.page_size;
  out->dtype = s.dtype;
  if (auto p = copy_i32(host, view.indptr, "indptr", s, B + 1, &out->indptr); !p.empty()) return {p};
  for (int32_t b = 0; b <= B; ++b)
    if (view.indptr_host[b] != out->indptr[b])
      return {"host mirror indptr_host[" + std::to_string(b) + "] = " + std::to_string(view.indptr_host[b]) +
              " but the device array says " + std::to_string(out->indptr[b])};
  if (out->indptr[0] != 0) return {"indptr[0] is " + std::to_string(out->indptr[0]) + ", not 0"};
  for (int32_t b = 0; b < B; ++b) {
    const int32_t want = (resident[b] + s.page_size - 1) / s.page_size;
    const int32_t got = out->indptr[b + 1] - out->indptr[b];
    if (got < 0) return {"indptr decreases at " + std::to_string(b + 1)};
    if (got != want)
      bad.push_back("batch entry " + std::to_string(b) + " lists " + std::to_string(got) + " pages for " +
                    std::to_string(resident[b]) + " resident tokens (expected " + std::to_string(want) + ")");
  }
  if (!bad.empty()) return bad;
  if (auto p = copy_i32(host, view.last_page_len, "last_page_len", s, B, &out->last_page_len); !p.empty()) return {p};
  for (int32_t b = 0; b < B; ++b) {
    if (view.last_page_len_host[b] != out->last_page_len[b])
      bad.push_back("host mirror last_page_len_host[" + std::to_string(b) + "] = " +
                    std::to_string(view.last_page_len_host[b]) + " but the device array says " +
                    std::to_string(out->last_page_len[b]));
    const int32_t n = out->indptr[b + 1] - out->indptr[b];
    if (n == 0) continue;
    const int32_t want = resident[b] - (n - 1) * s.page_size;
    if (out->last_page_len[b] < 1 || out->last_page_len[b] > s.page_size || out->last_page_len[b] != want)
      bad.push_back("last_page_len[" + std::to_string(b) + "] = " + std::to_string(out->last_page_len[b]) +
                    " (must be in 1.." + std::to_string(s.page_size) + "; " + std::to_string(resident[b]) +
                    " resident tokens over " + std::to_string(n) + " pages make " + std::to_string(want) + ")");
  }
  if (auto p = copy_i32(host, view.indices, "indices", s, out->indptr[B], &out->indices); !p.empty()) return {p};
  if (auto p = copy_pool(host, view.k_pages, "k_pages", s, &out->k, out->k_strides); !p.empty()) return {p};
  if (auto p = copy_pool(host, view.v_pages, "v_pages", s, &out->v, out->v_strides); !p.empty()) return {p};
  if (s.pre_rope) {
    if (auto p = copy_pool(host, view.k_pre_rope_pages, "k_pre_rope_pages", s, &out->k_pre_rope, out->pre_strides); !p.empty())
      return {p + " (the store was configured to keep pre-RoPE keys)"};
    if (view.k_pre_rope_pages.shape[0] < view.k_pages.shape[0]) return {"k_pre_rope_pages has fewer pages than k_pages"};
  }
  out->capacity = view.k_pages.shape[0];
  if (view.v_pages.shape[0] != out->capacity) bad.push_back("k_pages and v_pages differ in page count");
  if (s.capacity && out->capacity < s.capacity)
    bad.push_back("the pool holds " + std::to_string(out->capacity) + " pages, fewer than pages_per_layer " +
                  std::to_string(s.capacity));
  std::map<int32_t, int32_t> owner;  // physical page -> batch entry
  for (int32_t b = 0; b < B; ++b)
    for (int32_t e = out->indptr[b]; e < out->indptr[b + 1]; ++e) {
      const int32_t p = out->indices[e];
      if (p < 0 || p >= out->capacity) {
        bad.push_back("indices[" + std::to_string(e) + "] = " + std::to_string(p) + " is outside the pool [0, " +
                      std::to_string(out->capacity) + ")");
        return bad;
      }
      auto [it, fresh] = owner.emplace(p, b);
      if (!fresh)
        bad.push_back("physical page " + std::to_string(p) + " is listed twice (batch entries " +
                      std::to_string(it->second) + " and " + std::to_string(b) + ")");
    }
  return bad;
}

double conversion_bound(DLDataType t) {
  if (t.bits == 32) return 0;
  return t.code == kDLBfloat ? 0x1p-8 : 0x1p-11;
}

std::string compare_rows(const ViewCopy& view, int32_t b, const RefRows& ref, const Shape& s, const std::string& who) {
  const int32_t H = s.n_kv_heads, D = s.head_dim, P = s.page_size;
  const int64_t row = int64_t(H) * D;
  const double u = conversion_bound(s.dtype);
  const auto pages = view.pages(b);
  for (int64_t t = 0; t < ref.tokens(row); ++t) {
    const int32_t page = pages.at(size_t(t / P)), slot = int32_t(t % P);
    for (int32_t h = 0; h < H; ++h)
      for (int32_t d = 0; d < D; ++d) {
        const double want_k = ref.k[size_t(t * row + h * D + d)], want_v = ref.v[size_t(t * row + h * D + d)];
        const double got_k = view.k_at(page, h, slot, d), got_v = view.v_at(page, h, slot, d);
        const bool pre = !ref.k_pre_rope.empty();
        const double want_p = pre ? ref.k_pre_rope[size_t(t * row + h * D + d)] : 0;
        const double got_p = pre ? view.pre_at(page, h, slot, d) : 0;
        for (auto [got, want, kv] : {std::tuple{got_k, want_k, "K"}, std::tuple{got_v, want_v, "V"},
                                     std::tuple{got_p, want_p, "pre-RoPE K"}})
          if (!(std::fabs(got - want) <= u * std::fabs(want))) {
            char buf[256];
            std::snprintf(buf, sizeof buf, "%s token %lld (page %d slot %d), head %d, dim %d: %s = %.9g, the reference %.9g (bound %.3g)",
                          who.c_str(), (long long)t, page, slot, h, d, kv, got, want, u * std::fabs(want));
            return buf;
          }
      }
  }
  return {};
}

}  // namespace sieve::runtime::store_conform
