// The quest plugin's CUDA path chooses the same pages as its CPU path (and as the from-the-keys
// reference): two instances, one on the CPU over a FakePagedKv, one on CUDA over a device mirror
// of the same pages (K pool, page table, queries; the min/max sidecar lives on the device and is
// maintained by the fused append kernel), prefill then decode steps at ragged lengths, per query
// head and with gqa_share, f32 and bf16 pages, budgets of one page, between the sequences' page
// counts and above all of them (dense). Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "mocks/fake_paged_kv.hpp"
#include "mocks/mock_host_services.hpp"
#include "mocks/mock_kv_store.hpp"
#include "quest_reference.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::NiceMock;
using ::testing::Return;

constexpr DLDevice kCuda0{kDLCUDA, 0};

struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t n) : bytes(std::max<size_t>(n, 4)) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  void put(const void* src, size_t n) {
    EXPECT_EQ(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the plugin's stream does not wait for it
  }
  template <class T>
  std::vector<T> get(size_t n) const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

class QuestCuda : public ::testing::TestWithParam<std::tuple<bool, int, int>> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device: quest's CUDA path is not exercised";
    ASSERT_TRUE(lib_.loaded()) << lib_.path() << ": " << lib_.error();
    api_ = lib_.negotiate()->policy;
    host_.set_device_allocator(
        [](DLDevice, size_t bytes) -> void* {
          void* p = nullptr;
          return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
        },
        [](DLDevice, void* p) { cudaFree(p); });
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ON_CALL(host_, cuda_stream()).WillByDefault(Return(static_cast<void*>(stream_)));
  }
  void TearDown() override {
    if (!api_) return;
    for (sieve_policy* p : policies_) api_->destroy(p);
    EXPECT_EQ(host_.live_allocations(), 0u);
    cudaStreamDestroy(stream_);
  }
  sieve_policy* create(const sieve_geometry& g, sieve_kv_store* kv, const sieve_kv_store_api* api,
                       int64_t budget, bool gqa_share) {
    sieve_param_value v[2] = {{SIEVE_PARAM_INT, budget, 0, nullptr, nullptr, 0},
                              {SIEVE_PARAM_BOOL, gqa_share ? 1 : 0, 0, nullptr, nullptr, 0}};
    sieve_policy* p = nullptr;
    ReasonLog err;
    EXPECT_EQ(api_->create(host_.table(), &g, v, 2, kv, api, &p, err.sink()), SIEVE_OK) << err.all();
    if (p) policies_.push_back(p);
    return p;
  }

  PluginLibrary lib_{"quest"};
  const sieve_policy_api* api_ = nullptr;
  NiceMock<MockHostServices> host_;
  std::vector<sieve_policy*> policies_;
  cudaStream_t stream_ = nullptr;
};

TEST_P(QuestCuda, ChoosesTheSamePagesAsTheCpu) {
  const bool gqa_share = std::get<0>(GetParam());
  const DLDataType dtype = std::get<1>(GetParam()) == 0 ? sieve::kF32 : sieve::kBF16;
  sieve_geometry g = test_geometry(16, 4, 1024);
  g.n_q_heads = 8;
  g.n_kv_heads = 2;
  g.head_dim = 128;
  g.rope_dim = 128;
  g.kv_dtype = dtype;
  const int32_t pool = 300, budget = std::get<2>(GetParam());
  FakePagedKv fake(test_kv_config(g, pool));
  NiceMock<MockKvStore> cpu_store;
  cpu_store.delegate_to(fake);
  sieve_policy* cpu = create(g, cpu_store.handle(), cpu_store.api(), budget, gqa_share);
  ASSERT_NE(cpu, nullptr);

  // The device mirror: the K pool and a device sidecar behind a mock store.
  const size_t eb = sieve::dtype_bytes(dtype);
  const size_t pool_bytes = size_t(pool) * g.n_kv_heads * g.page_size * g.head_dim * eb;
  DeviceBuffer d_k(pool_bytes), d_side(size_t(pool) * g.n_kv_heads * 2 * g.head_dim * eb);
  int64_t side_shape[3] = {pool, g.n_kv_heads, 2 * g.head_dim};
  NiceMock<MockKvStore> dev_store;
  ON_CALL(dev_store, register_sidecar(_, _)).WillByDefault([](const sieve_sidecar_desc*, int32_t* slot) {
    *slot = 0;
    return SIEVE_OK;
  });
  ON_CALL(dev_store, sidecar(_, _, _)).WillByDefault([&](int32_t, int32_t, DLTensor* out) {
    *out = sieve::make_view(d_side.p, kCuda0, dtype, 3, side_shape);
    return SIEVE_OK;
  });
  sieve_geometry gd = g;
  gd.device = kCuda0;
  sieve_policy* dev = create(gd, dev_store.handle(), dev_store.api(), budget, gqa_share);
  ASSERT_NE(dev, nullptr);

  std::vector<int32_t> ids(3);
  for (auto& id : ids) ASSERT_EQ(fake.add_sequence(&id), SIEVE_OK);
  std::mt19937 rng(123);
  const std::vector<std::vector<int32_t>> steps = {{37, 90, 150}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1},
                                                   {1, 1, 1},     {1, 1, 1}, {1, 1, 1}};
  for (size_t s = 0; s < steps.size(); ++s) {
    const uint32_t phase = s == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
    for (size_t b = 0; b < ids.size(); ++b) ASSERT_EQ(fake.append_random(ids[b], steps[s][b], rng), SIEVE_OK);
    LayerCall call(fake, g, phase, 1, ids, steps[s], rng, cpu_store.handle(), cpu_store.api());
    sieve_kv_append a{};
    a.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
    a.layer = 1;
    a.batch = 3;
    a.seq_ids = ids.data();
    a.token_indptr = call.qo_indptr().data();
    ASSERT_EQ(api_->on_append(cpu, call.get(), &a), SIEVE_OK) << api_->last_error(cpu);

    // Mirror the call on the device.
    d_k.put(call.view().k_pages.data, pool_bytes);
    const sieve_paged_kv& hv = call.view();
    const int32_t nnz = hv.indptr_host[3];
    DeviceBuffer d_indptr(4 * 4), d_indices(size_t(nnz) * 4), d_last(3 * 4), d_qo(4 * 4),
        d_q(sieve::numel(*call.get()->q) * 4);
    d_indptr.put(hv.indptr_host, 16);
    d_indices.put(hv.indices.data, size_t(nnz) * 4);
    d_last.put(hv.last_page_len_host, 12);
    d_qo.put(call.qo_indptr().data(), 16);
    d_q.put(call.get()->q->data, size_t(sieve::numel(*call.get()->q)) * 4);
    int64_t s4 = 4, s3 = 3, snnz = nnz;
    sieve_paged_kv dv = hv;
    dv.k_pages.data = d_k.p;
    dv.k_pages.device = kCuda0;
    dv.v_pages.data = nullptr;
    dv.indptr = sieve::make_view(d_indptr.p, kCuda0, sieve::kI32, 1, &s4);
    dv.indices = sieve::make_view(d_indices.p, kCuda0, sieve::kI32, 1, &snnz);
    dv.last_page_len = sieve::make_view(d_last.p, kCuda0, sieve::kI32, 1, &s3);
    DLTensor qo = sieve::make_view(d_qo.p, kCuda0, sieve::kI32, 1, &s4);
    DLTensor q = *call.get()->q;
    q.data = d_q.p;
    q.device = kCuda0;
    sieve_layer_call dc = *call.get();
    dc.kv_view = &dv;
    dc.qo_indptr = &qo;
    dc.q = &q;
    dc.geometry = &gd;
    dc.kv = dev_store.handle();
    dc.kv_api = dev_store.api();
    ASSERT_EQ(api_->on_append(dev, &dc, &a), SIEVE_OK) << api_->last_error(dev);
    if (phase == SIEVE_PHASE_PREFILL) continue;

    const int64_t rows = 3 * g.n_q_heads, cap = 3 * 1024;
    HostSelection cpu_sel(rows, cap);
    uint32_t stats = 0;
    ASSERT_EQ(api_->select(cpu, call.get(), cpu_sel.get(), &stats), SIEVE_OK) << api_->last_error(cpu);
    DeviceBuffer d_sel_indptr(size_t(rows + 1) * 4), d_sel_indices(size_t(cap) * 4);
    cudaMemset(d_sel_indptr.p, 0xff, d_sel_indptr.bytes);
    cudaMemset(d_sel_indices.p, 0xff, d_sel_indices.bytes);
    int64_t s_rows = rows + 1, s_cap = cap;
    sieve_selection dsel = *cpu_sel.get();
    dsel.kind = SIEVE_SEL_ALL;
    dsel.indptr = sieve::make_view(d_sel_indptr.p, kCuda0, sieve::kI32, 1, &s_rows);
    dsel.indices = sieve::make_view(d_sel_indices.p, kCuda0, sieve::kI32, 1, &s_cap);
    dsel.capacity = cap;
    ASSERT_EQ(api_->select(dev, &dc, &dsel, &stats), SIEVE_OK) << api_->last_error(dev);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    ASSERT_EQ(dsel.kind, cpu_sel.sel().kind);
    if (dsel.kind == SIEVE_SEL_ALL) {  // dense: only when every sequence fits the budget
      for (int32_t b = 0; b < 3; ++b)
        ASSERT_LE(hv.indptr_host[b + 1] - hv.indptr_host[b], budget / g.page_size) << "step " << s;
      continue;
    }
    ASSERT_EQ(dsel.kind, SIEVE_SEL_BLOCKS);
    ASSERT_EQ(dsel.heads, cpu_sel.sel().heads);
    ASSERT_EQ(dsel.n_rows, cpu_sel.sel().n_rows);
    const auto ip = d_sel_indptr.get<int32_t>(size_t(dsel.n_rows) + 1);
    const auto ix = d_sel_indices.get<int32_t>(size_t(cap));
    const auto want = cpu_sel.rows();
    ASSERT_EQ(want, quest_reference(hv, *call.get()->q, g.n_q_heads, budget / g.page_size, gqa_share));
    for (int32_t r = 0; r < dsel.n_rows; ++r)
      ASSERT_EQ(std::vector<int32_t>(ix.begin() + ip[size_t(r)], ix.begin() + ip[size_t(r) + 1]), want[size_t(r)])
          << "step " << s << " row " << r;
  }
}

// Budgets (tokens): one page (the last page alone); 4 pages (the 37-token sequence's rows are
// dense, the others' are not); 12 pages (more than the 10 of the longest sequence: dense).
INSTANTIATE_TEST_SUITE_P(HeadsDtypesBudgets, QuestCuda,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(0, 1),
                                            ::testing::Values(16, 64, 192)));

}  // namespace
