// The dpxa plugin's CUDA path: its kernels (anchors, tile scores, greedy cover, CSR) write the same
// selection as its CPU path, tile for tile, for every estimator, both row kinds, f32 and bf16,
// ragged batches with chunked prefill and a sequence without queries, and a long sequence at the
// paper's block size (B = 128, d = 128: the shared-memory opt-in path). Hooks allocate nothing.
// Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dpxa_scenario.hpp"
#include "mocks/mock_host_services.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::NiceMock;
using ::testing::Return;

#define CUDA_OK(expr)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (expr);                                                           \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);             \
  } while (0)

constexpr DLDevice kCuda0{kDLCUDA, 0};

// A device copy of a host tensor (same shape/dtype), or of poison ints.
struct DeviceCopy {
  DeviceCopy(const void* host, size_t bytes) : bytes(bytes) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 4)) != cudaSuccess) p = nullptr;
    else if (host) cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice);
  }
  ~DeviceCopy() { cudaFree(p); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  std::vector<int32_t> ints() const {
    std::vector<int32_t> h(bytes / 4);
    cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
  void* p = nullptr;
  size_t bytes;
};

// The scenario's call with q, the K/V pool and the page table on the device.
struct DeviceCall {
  explicit DeviceCall(DpxaScenario& sc)
      : q(sc.w.q.dl().data, size_t(sc.w.q.numel()) * sieve::dtype_bytes(sc.w.q.dl().dtype)),
        k(sc.w.k_pages.dl().data,
          size_t(sc.w.k_pages.numel()) * sieve::dtype_bytes(sc.w.k_pages.dl().dtype)),
        indices(sc.w.kv_indices.dl().data, size_t(sc.w.kv_indices.numel()) * 4),
        indptr(sc.w.kv_indptr.dl().data, size_t(sc.w.kv_indptr.numel()) * 4),
        qo(sc.w.qo_indptr.dl().data, size_t(sc.w.qo_indptr.numel()) * 4) {
    geometry = sc.g;
    geometry.device = kCuda0;
    q_t = sc.w.q.dl();
    q_t.data = q.p;
    q_t.device = kCuda0;
    view = sc.w.kv;
    view.k_pages.data = k.p;
    view.k_pages.device = kCuda0;
    view.v_pages.device = kCuda0;
    view.indices.data = indices.p;
    view.indices.device = kCuda0;
    view.indptr.data = indptr.p;
    view.indptr.device = kCuda0;
    qo_t = sc.w.qo_indptr.dl();
    qo_t.data = qo.p;
    qo_t.device = kCuda0;
    call = sc.call;
    call.q = &q_t;
    call.qo_indptr = &qo_t;
    call.kv_view = &view;
    call.geometry = &geometry;
  }
  DeviceCopy q, k, indices, indptr, qo;
  DLTensor q_t{}, qo_t{};
  sieve_geometry geometry{};
  sieve_paged_kv view{};
  sieve_layer_call call{};
};

class DpxaCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount "
                   << (e != cudaSuccess ? std::string("failed: ") + cudaGetErrorString(e)
                                        : std::string("reports 0 devices"));
    ASSERT_TRUE(lib_.loaded()) << lib_.path() << ": " << lib_.error();
    const sieve_plugin* plugin = lib_.negotiate();
    ASSERT_NE(plugin, nullptr);
    api_ = plugin->policy;
    host_.set_device_allocator(
        [](DLDevice, size_t bytes) -> void* {
          void* p = nullptr;
          return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
        },
        [](DLDevice, void* p) { cudaFree(p); });
    CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ON_CALL(host_, cuda_stream()).WillByDefault(Return(static_cast<void*>(stream_)));
  }
  void TearDown() override {
    if (!api_) return;
    for (sieve_policy* p : policies_) api_->destroy(p);
    EXPECT_EQ(host_.live_allocations(), 0u);
    cudaStreamDestroy(stream_);
  }
  sieve_policy* create(const sieve_geometry& g, const DpxaArgs& a) {
    DpxaValues v(a);
    sieve_policy* p = nullptr;
    ReasonLog err;
    if (api_->create(host_.table(), &g, v.v, 7, nullptr, nullptr, &p, err.sink()) != SIEVE_OK) {
      ADD_FAILURE() << "create on " << sieve::device_name(g.device) << ": " << err.all();
      return nullptr;
    }
    policies_.push_back(p);
    return p;
  }
  // CUDA CSR == CPU CSR (all rows, every entry), with a non-trivial number of pruned tiles.
  void compare(DpxaScenario& sc, const DpxaArgs& a) {
    SCOPED_TRACE(::testing::Message() << a.estimator << " tau=" << a.tau << " rows=" << a.rows
                                      << " block=" << a.block);
    DeviceCall dc(sc);
    sieve_policy* cpu = create(sc.g, a);
    sieve_policy* gpu = create(dc.geometry, a);
    ASSERT_TRUE(cpu && gpu);
    const int64_t max_rows = int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads;
    const int64_t capacity = 1 << 20;
    HostSelection host_sel(max_rows, capacity);
    std::vector<int32_t> poison(size_t(capacity), kSelectionPoison);
    DeviceCopy d_indptr(poison.data(), size_t(max_rows + 1) * 4), d_indices(poison.data(), size_t(capacity) * 4);
    int64_t shapes[2] = {max_rows + 1, capacity};
    sieve_selection dsel{};
    dsel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    dsel.kind = SIEVE_SEL_ALL;
    dsel.q_block = 1;
    dsel.k_block_pages = 1;
    dsel.indptr = sieve::make_view(d_indptr.p, kCuda0, sieve::kI32, 1, &shapes[0]);
    dsel.indices = sieve::make_view(d_indices.p, kCuda0, sieve::kI32, 1, &shapes[1]);
    dsel.capacity = capacity;
    uint32_t stats = 0;
    ASSERT_EQ(api_->select(cpu, &sc.call, host_sel.get(), &stats), SIEVE_OK) << api_->last_error(cpu);
    EXPECT_CALL(host_, alloc(_, _, _)).Times(0);  // hooks never allocate
    ASSERT_EQ(api_->select(gpu, &dc.call, &dsel, &stats), SIEVE_OK) << api_->last_error(gpu);
    ::testing::Mock::VerifyAndClearExpectations(&host_);
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(dsel.n_rows, host_sel.sel().n_rows);
    EXPECT_EQ(dsel.heads, host_sel.sel().heads);
    EXPECT_EQ(dsel.q_block, host_sel.sel().q_block);
    EXPECT_EQ(dsel.k_block_pages, host_sel.sel().k_block_pages);
    const auto indptr = d_indptr.ints(), indices = d_indices.ints();
    const int32_t n_rows = host_sel.sel().n_rows;
    ASSERT_GT(n_rows, 0);
    for (int32_t r = 0; r <= n_rows; ++r)
      ASSERT_EQ(indptr[size_t(r)], host_sel.indptr()[size_t(r)]) << "indptr[" << r << "]";
    const int32_t nnz = host_sel.indptr()[size_t(n_rows)];
    int32_t mismatches = 0;
    for (int32_t e = 0; e < nnz; ++e) mismatches += indices[size_t(e)] != host_sel.indices()[size_t(e)];
    EXPECT_EQ(mismatches, 0) << "of " << nnz << " entries";
    EXPECT_EQ(indices[size_t(nnz)], kSelectionPoison) << "wrote past the last row";
  }

  PluginLibrary lib_{"dpxa"};
  const sieve_policy_api* api_ = nullptr;
  NiceMock<MockHostServices> host_;
  cudaStream_t stream_ = nullptr;
  std::vector<sieve_policy*> policies_;
};

TEST_F(DpxaCuda, RaggedBatchMatchesTheCpuPath) {
  for (DLDataType t : {sieve::kF32, sieve::kBF16}) {
    DpxaScenario sc({300, 200, 40, 64}, {300, 77, 40, 0}, 16, 4, 2, 32, 5, t);
    for (const char* est : {"dpxa", "xattn", "stride"})
      for (double tau : {0.5, 0.9})
        for (const char* rows : {"q_head", "kv_head"}) {
          DpxaArgs a;
          a.estimator = est;
          a.tau = tau;
          a.rows = rows;
          compare(sc, a);
        }
  }
}

TEST_F(DpxaCuda, LongSequenceAtThePapersBlockSize) {
  DpxaScenario sc({3000}, {3000}, 16, 8, 2, 128, 9, sieve::kBF16);
  sc.g.max_seq_len = 4096;
  for (const char* est : {"dpxa", "xattn"}) {
    DpxaArgs a;
    a.estimator = est;
    a.block = 128;
    a.tau = 0.9;
    compare(sc, a);
  }
}

}  // namespace
