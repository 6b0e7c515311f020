// The delta plugin's CUDA path: given the same page statistics (uploaded to the device), its
// kernels (plugins/delta/cuda/delta_select.cu + core/selection's top-k) pick exactly the pages of
// its CPU path — with ties everywhere, windows that straddle page boundaries, short (dense)
// sequences, per sequence and per KV head — and the sparse layers' selection is copied on the
// host's stream. Hooks neither allocate nor free. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "delta/delta_scenario.hpp"
#include "support/cuda_policy_test.hpp"
#include "support/host_selection.hpp"

namespace {

using namespace sieve::testing;

constexpr DLDevice kCuda0{kDLCUDA, 0};

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(int64_t(host.size())) {
    if (cudaMalloc(&p_, std::max<size_t>(1, host.size()) * sizeof(T)) != cudaSuccess) p_ = nullptr;
    else if (!host.empty()) cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaDeviceSynchronize();
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> read() const {
    std::vector<T> h(static_cast<size_t>(n_));
    cudaMemcpy(h.data(), p_, h.size() * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  T* get() const { return p_; }
  int64_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  int64_t n_;
};

// A scenario layer call with the view's page table and qo_indptr on the device.
struct DeviceCall {
  explicit DeviceCall(LayerCall& c)
      : qo(c.qo_indptr()),
        kv_indptr(std::vector<int32_t>(c.view().indptr_host, c.view().indptr_host + c.get()->batch + 1)),
        last_page_len(std::vector<int32_t>(c.view().last_page_len_host,
                                           c.view().last_page_len_host + c.get()->batch)),
        geometry(*c.get()->geometry) {
    geometry.device = kCuda0;
    qo_shape = qo.size();
    kv_shape = kv_indptr.size();
    lpl_shape = last_page_len.size();
    qo_t = sieve::make_view(qo.get(), kCuda0, sieve::kI32, 1, &qo_shape);
    view = c.view();
    view.indptr = sieve::make_view(kv_indptr.get(), kCuda0, sieve::kI32, 1, &kv_shape);
    view.last_page_len = sieve::make_view(last_page_len.get(), kCuda0, sieve::kI32, 1, &lpl_shape);
    call = *c.get();
    call.qo_indptr = &qo_t;
    call.kv_view = &view;
    call.geometry = &geometry;
  }
  DeviceArray<int32_t> qo, kv_indptr, last_page_len;
  int64_t qo_shape = 0, kv_shape = 0, lpl_shape = 0;
  DLTensor qo_t{};
  sieve_geometry geometry;
  sieve_paged_kv view{};
  sieve_layer_call call{};
};

struct DeviceSelection {
  DeviceSelection(int64_t max_rows, int64_t capacity)
      : indptr(std::vector<int32_t>(size_t(max_rows + 1), kSelectionPoison)),
        indices(std::vector<int32_t>(size_t(capacity), kSelectionPoison)),
        shapes{max_rows + 1, capacity} {
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel.kind = SIEVE_SEL_ALL;
    sel.q_block = 1;
    sel.k_block_pages = 1;
    sel.indptr = sieve::make_view(indptr.get(), kCuda0, sieve::kI32, 1, &shapes[0]);
    sel.indices = sieve::make_view(indices.get(), kCuda0, sieve::kI32, 1, &shapes[1]);
    sel.capacity = capacity;
  }
  DeviceArray<int32_t> indptr, indices;
  int64_t shapes[2];
  sieve_selection sel{};
};

class DeltaCuda : public CudaPolicyTest {
 protected:
  DeltaCuda() : CudaPolicyTest("delta") {}
  sieve_policy* create(const sieve_geometry& g, DeltaParams params) {
    return create_policy(g, params.values(), DeltaParams::kCount);
  }
  static sieve_attention_stats stats_of(float* data, DLDevice dev, int64_t* shape, uint32_t request) {
    sieve_attention_stats st{};
    st.hdr = SIEVE_HEADER_INIT(sieve_attention_stats);
    st.request = request;
    st.page_mass = sieve::make_view(data, dev, sieve::kF32, 2, shape);
    return st;
  }

  // Same scores through the CPU and the CUDA instance; the sparse layer's lists must agree.
  void compare(DeltaScenario& sc, DeltaParams params, std::vector<float> scores) {
    const bool per_kv = params.per_kv_head;
    const int32_t H = per_kv ? sc.geometry.n_kv_heads : 1;
    const uint32_t request =
        per_kv ? SIEVE_STATS_PAGE_MASS_PER_KV_HEAD : SIEVE_STATS_PAGE_MASS_ALL_HEADS;
    SCOPED_TRACE(::testing::Message() << "P=" << sc.geometry.page_size << " K=" << params.token_budget
                                      << " L=" << params.recent << " H=" << H);
    auto c2 = sc.call(2);
    auto c3 = sc.call(3);
    DeviceCall d2(*c2), d3(*c3);
    sieve_policy* cpu = create(sc.geometry, params);
    sieve_policy* gpu = create(d2.geometry, params);
    ASSERT_TRUE(cpu && gpu);
    uint32_t stats = 0;
    HostSelection hs(64, 64);
    DeviceSelection ds(64, 64);
    ASSERT_EQ(api_->select(cpu, c2->get(), hs.get(), &stats), SIEVE_OK) << api_->last_error(cpu);
    ASSERT_EQ(api_->select(gpu, &d2.call, &ds.sel, &stats), SIEVE_OK) << api_->last_error(gpu);
    ASSERT_EQ(stats, request);
    int64_t shape[2] = {int64_t(scores.size()) / H, H};
    DeviceArray<float> dev_scores(scores);
    sieve_attention_stats host_st = stats_of(scores.data(), sieve::kCpu, shape, request);
    sieve_attention_stats dev_st = stats_of(dev_scores.get(), kCuda0, shape, request);
    ASSERT_EQ(api_->observe(cpu, c2->get(), &host_st), SIEVE_OK) << api_->last_error(cpu);
    ASSERT_EQ(api_->observe(gpu, &d2.call, &dev_st), SIEVE_OK) << api_->last_error(gpu);

    const int64_t rows = int64_t(sc.lens.size()) * H, cap = 4096;
    HostSelection host_sel(rows + 2, cap);
    DeviceSelection dev_sel(rows + 2, cap);
    ASSERT_EQ(api_->select(cpu, c3->get(), host_sel.get(), &stats), SIEVE_OK) << api_->last_error(cpu);
    ASSERT_EQ(api_->select(gpu, &d3.call, &dev_sel.sel, &stats), SIEVE_OK) << api_->last_error(gpu);
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(dev_sel.sel.kind, host_sel.sel().kind);
    EXPECT_EQ(dev_sel.sel.heads, host_sel.sel().heads);
    ASSERT_EQ(dev_sel.sel.n_rows, host_sel.sel().n_rows);
    const auto indptr = dev_sel.indptr.read(), indices = dev_sel.indices.read();
    for (int64_t r = 0; r <= rows; ++r) ASSERT_EQ(indptr[size_t(r)], host_sel.indptr()[size_t(r)]) << "indptr " << r;
    for (int32_t i = 0; i < indptr[size_t(rows)]; ++i)
      ASSERT_EQ(indices[size_t(i)], host_sel.indices()[size_t(i)]) << "index " << i;
    // And both equal the definition.
    for (size_t b = 0; b < sc.lens.size(); ++b)
      for (int32_t h = 0; h < H; ++h) {
        const int32_t base = c2->view().indptr_host[b];
        const auto expected = reference_row(sc.lens[b], params.recent, params.token_budget,
                                            sc.geometry.page_size,
                                            [&](int32_t u) { return scores[size_t((base + u) * H + h)]; });
        EXPECT_EQ(host_sel.rows()[b * size_t(H) + size_t(h)], expected) << "sequence " << b;
      }
  }
};

TEST_F(DeltaCuda, SamePagesAsTheCpuPath) {
  for (int32_t P : {1, 4, 16}) {
    std::vector<int32_t> lens;
    for (int32_t len : {1, P, P + 1, 3 * P - 1, 7 * P + 1, 97, 200, 257, 511})
      lens.push_back(len);
    DeltaScenario sc(P, lens);
    for (bool per_kv : {false, true})
      for (int64_t budget_pages : {2, 5, 16})
        for (int64_t recent : {1, 3, 8, 17}) {
          if (worst_window_pages(recent, P) > budget_pages) continue;
          DeltaParams params;
          params.token_budget = budget_pages * P;
          params.recent = recent;
          params.per_kv_head = per_kv;
          const int32_t H = per_kv ? sc.geometry.n_kv_heads : 1;
          std::vector<float> scores(size_t(sc.total_pages() * H));
          std::uniform_int_distribution<int> small(0, 3);  // ties
          std::uniform_real_distribution<float> u(0.f, 2.f);
          for (size_t i = 0; i < scores.size(); ++i) scores[i] = i % 3 ? float(small(sc.rng)) : u(sc.rng);
          compare(sc, params, scores);
        }
  }
}

TEST_F(DeltaCuda, HooksNeitherAllocateNorFree) {
  DeltaScenario sc(4, {30, 77});
  DeltaParams params;
  params.token_budget = 16;
  params.recent = 4;
  auto c2 = sc.call(2);
  DeviceCall d2(*c2);
  sieve_policy* p = create(d2.geometry, params);
  ASSERT_NE(p, nullptr);
  EXPECT_CALL(host_, alloc).Times(0);
  EXPECT_CALL(host_, free).Times(0);
  std::vector<float> scores(size_t(sc.total_pages()), 0.5f);
  DeviceArray<float> dev_scores(scores);
  int64_t shape[2] = {int64_t(scores.size()), 1};
  sieve_attention_stats st = stats_of(dev_scores.get(), kCuda0, shape, SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  for (int step = 0; step < 3; ++step) {
    DeviceSelection sel(4, 64);
    uint32_t stats = 0;
    ASSERT_EQ(api_->select(p, &d2.call, &sel.sel, &stats), SIEVE_OK) << api_->last_error(p);
    ASSERT_EQ(api_->observe(p, &d2.call, &st), SIEVE_OK) << api_->last_error(p);
    auto c3 = sc.call(3);
    DeviceCall d3(*c3);
    ASSERT_EQ(api_->select(p, &d3.call, &sel.sel, &stats), SIEVE_OK) << api_->last_error(p);
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
  }
  ::testing::Mock::VerifyAndClearExpectations(&host_);
}

}  // namespace
