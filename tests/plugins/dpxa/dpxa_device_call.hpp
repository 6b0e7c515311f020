// The dpxa CUDA tests' device side of a DpxaScenario (include from CUDA test sources only):
// byte buffers, the scenario's layer call with every tensor on the device, and a device CSR
// selection whose ints start poisoned.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "dpxa_scenario.hpp"
#include "sieve/reference/page_pool.hpp"
#include "sieve/util/tensor.hpp"
#include "support/host_selection.hpp"

namespace sieve::testing {

constexpr DLDevice kCuda0{kDLCUDA, 0};

// Device bytes, optionally uploaded from the host (and waited for).
struct DeviceBytes {
  explicit DeviceBytes(size_t n, const void* host = nullptr) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 16)), cudaSuccess);
    if (host && p) {
      EXPECT_EQ(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the plugin's stream does not wait for it
    }
  }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  template <class T>
  std::vector<T> get() const {
    std::vector<T> h(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void* p = nullptr;
  size_t bytes;
};

inline size_t tensor_bytes(const sieve::HostTensor& t) {
  return size_t(t.numel()) * sieve::dtype_bytes(t.dl().dtype);
}

// The scenario's layer call with every tensor on the device (the host mirrors stay host). With a
// `pool`, K and V are its engine-layout copy (strided views over one device buffer).
struct DeviceCall {
  explicit DeviceCall(DpxaScenario& sc, const sieve::reference::LaidOutPool* pool = nullptr)
      : q(tensor_bytes(sc.w.q), sc.w.q.dl().data),
        out(tensor_bytes(sc.w.out)),
        k(tensor_bytes(sc.w.k_pages), sc.w.k_pages.dl().data),
        v(tensor_bytes(sc.w.v_pages), sc.w.v_pages.dl().data),
        qo(tensor_bytes(sc.w.qo_indptr), sc.w.qo_indptr.dl().data),
        indptr(tensor_bytes(sc.w.kv_indptr), sc.w.kv_indptr.dl().data),
        indices(tensor_bytes(sc.w.kv_indices), sc.w.kv_indices.dl().data),
        last(tensor_bytes(sc.w.kv_last_page_len), sc.w.kv_last_page_len.dl().data),
        out_dtype(sc.w.out.dl().dtype) {
    geometry = sc.g;
    geometry.device = kCuda0;
    auto on_device = [](DLTensor t, void* p) {
      t.data = p;
      t.device = kCuda0;
      t.byte_offset = 0;
      return t;
    };
    q_t = on_device(sc.w.q.dl(), q.p);
    out_t = on_device(sc.w.out.dl(), out.p);
    qo_t = on_device(sc.w.qo_indptr.dl(), qo.p);
    view = sc.w.kv;
    view.k_pages = on_device(view.k_pages, k.p);
    view.v_pages = on_device(view.v_pages, v.p);
    if (pool) {
      pool_bytes = std::make_unique<DeviceBytes>(tensor_bytes(pool->storage), pool->storage.dl().data);
      const DLTensor mem = on_device(pool->storage.dl(), pool_bytes->p);
      view.k_pages = pool->k_view(mem);
      view.v_pages = pool->v_view(mem);
    }
    view.indptr = on_device(view.indptr, indptr.p);
    view.indices = on_device(view.indices, indices.p);
    view.last_page_len = on_device(view.last_page_len, last.p);
    call = sc.call;
    call.q = &q_t;
    call.qo_indptr = &qo_t;
    call.kv_view = &view;
    call.geometry = &geometry;
  }
  // NaN in f32 and 16-bit floats; synchronised, as the plugin's stream does not wait for it.
  void poison() {
    ASSERT_EQ(cudaMemset(out.p, 0xFF, out.bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<double> output() const {
    const auto raw = out.get<uint8_t>();
    const int64_t n = int64_t(out.bytes / sieve::dtype_bytes(out_dtype));
    std::vector<double> o(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) o[size_t(i)] = sieve::load_float(raw.data(), out_dtype, i);
    return o;
  }
  DeviceBytes q, out, k, v, qo, indptr, indices, last;
  std::unique_ptr<DeviceBytes> pool_bytes;
  DLDataType out_dtype;
  DLTensor q_t{}, out_t{}, qo_t{};
  sieve_geometry geometry{};
  sieve_paged_kv view{};
  sieve_layer_call call{};
};

// A device CSR selection of up to max_rows rows and `capacity` entries, every int poisoned
// (kSelectionPoison) so a write past the last row shows.
struct DeviceSelection {
  DeviceSelection(int64_t max_rows, int64_t capacity)
      : poison_(size_t(std::max(max_rows + 1, capacity)), kSelectionPoison),
        indptr(size_t(max_rows + 1) * 4, poison_.data()),
        indices(size_t(capacity) * 4, poison_.data()),
        shapes{max_rows + 1, capacity} {
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel.kind = SIEVE_SEL_ALL;
    sel.q_block = 1;
    sel.k_block_pages = 1;
    sel.indptr = sieve::make_view(indptr.p, kCuda0, sieve::kI32, 1, &shapes[0]);
    sel.indices = sieve::make_view(indices.p, kCuda0, sieve::kI32, 1, &shapes[1]);
    sel.capacity = capacity;
  }
  DeviceSelection(const DeviceSelection&) = delete;  // sel points into shapes
  DeviceSelection& operator=(const DeviceSelection&) = delete;
  // The rows the plugin wrote (after its stream was synchronised).
  std::vector<std::vector<int32_t>> rows() const {
    const auto ip = indptr.get<int32_t>(), ix = indices.get<int32_t>();
    std::vector<std::vector<int32_t>> out(size_t(sel.n_rows));
    for (int32_t r = 0; r < sel.n_rows; ++r)
      out[size_t(r)].assign(ix.begin() + ip[size_t(r)], ix.begin() + ip[size_t(r) + 1]);
    return out;
  }

 private:
  std::vector<int32_t> poison_;

 public:
  DeviceBytes indptr, indices;
  int64_t shapes[2];
  sieve_selection sel{};
};

}  // namespace sieve::testing
