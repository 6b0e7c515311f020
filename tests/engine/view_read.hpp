// Reading a store's view the way a consumer that honours strides does: token t of sequence b
// through the page table, the view tensors' strides and byte_offset (CPU or device memory).
#pragma once
#include <gtest/gtest.h>

#include <vector>

#include "sieve/kv_store.h"
#include "sieve/runtime/host_services.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::engine_test {

class ViewReader {
 public:
  ViewReader(runtime::HostServices& s, const sieve_paged_kv& v) : s_(s), v_(v) {
    indices_.resize(size_t(std::max<int32_t>(v.indptr_host[v.batch], 1)));
    std::string e;
    if (v.indptr_host[v.batch] > 0) {
      EXPECT_TRUE(s.copy(indices_.data(), kCpu, data_ptr<void>(v.indices), v.indices.device,
                         size_t(v.indptr_host[v.batch]) * 4, &e))
          << e;
    }
  }
  int32_t tokens(int32_t b) const {
    const int32_t n = v_.indptr_host[b + 1] - v_.indptr_host[b];
    return n ? (n - 1) * v_.page_size + v_.last_page_len_host[b] : 0;
  }
  int32_t physical_page(int32_t b, int32_t t) const { return indices_[size_t(v_.indptr_host[b] + t / v_.page_size)]; }
  // Row (b, t, h) of K (kv 0), V (kv 1) or pre-RoPE K (kv 2).
  std::vector<float> row(int kv, int32_t b, int32_t t, int32_t h) const {
    const DLTensor& p = kv == 0 ? v_.k_pages : kv == 1 ? v_.v_pages : v_.k_pre_rope_pages;
    const int64_t off = physical_page(b, t) * stride(p, 0) + h * stride(p, 1) + (t % v_.page_size) * stride(p, 2);
    const int64_t d = p.shape[3];
    std::vector<unsigned char> raw(size_t(d) * dtype_bytes(p.dtype));
    std::string e;
    EXPECT_TRUE(s_.copy(raw.data(), kCpu, data_ptr<char>(p) + off * int64_t(dtype_bytes(p.dtype)), p.device, raw.size(), &e))
        << e;
    std::vector<float> out(static_cast<size_t>(d));
    for (int64_t x = 0; x < d; ++x) out[size_t(x)] = load_float(raw.data(), p.dtype, x);
    return out;
  }

 private:
  runtime::HostServices& s_;
  const sieve_paged_kv& v_;
  std::vector<int32_t> indices_;
};

}  // namespace sieve::engine_test
