// The streaming plugin's CUDA path: its selection kernels (cuda/streaming_select.cu) write, on
// the host's stream, the same lists as its CPU path and as the naive reference, at ragged
// lengths, with more sequences and rows than one scan chunk; overflow is refused before any
// launch. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mocks/mock_host_services.hpp"
#include "streaming_scenario.hpp"
#include "support/cuda_policy_test.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::HasSubstr;

constexpr DLDevice kCuda0{kDLCUDA, 0};

// An int32 device array, filled from (or poisoned like) a host vector.
class DeviceInts {
 public:
  explicit DeviceInts(const std::vector<int32_t>& host) : n_(int64_t(host.size())) {
    if (cudaMalloc(&p_, std::max<size_t>(1, host.size()) * sizeof(int32_t)) != cudaSuccess) p_ = nullptr;
    else if (!host.empty()) cudaMemcpy(p_, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaDeviceSynchronize();
  }
  ~DeviceInts() { cudaFree(p_); }
  DeviceInts(const DeviceInts&) = delete;
  DeviceInts& operator=(const DeviceInts&) = delete;
  DLTensor tensor() { return sieve::make_view(p_, kCuda0, sieve::kI32, 1, &n_); }
  std::vector<int32_t> read() const {
    std::vector<int32_t> h(static_cast<size_t>(n_));
    cudaMemcpy(h.data(), p_, h.size() * sizeof(int32_t), cudaMemcpyDeviceToHost);
    return h;
  }
  int32_t* get() const { return p_; }

 private:
  int32_t* p_ = nullptr;
  int64_t n_;
};

// The scenario's layer call with its small arrays on the device (host mirrors unchanged).
struct DeviceCall {
  explicit DeviceCall(StreamingScenario& sc)
      : qo(sc.call->qo_indptr()),
        kv_indptr(std::vector<int32_t>(sc.call->view().indptr_host,
                                       sc.call->view().indptr_host + sc.call->get()->batch + 1)),
        last_page_len(std::vector<int32_t>(sc.call->view().last_page_len_host,
                                           sc.call->view().last_page_len_host + sc.call->get()->batch)),
        geometry(sc.geometry) {
    geometry.device = kCuda0;
    qo_t = qo.tensor();
    view = sc.call->view();
    view.indptr = kv_indptr.tensor();
    view.last_page_len = last_page_len.tensor();
    call = *sc.call->get();
    call.qo_indptr = &qo_t;
    call.kv_view = &view;
    call.geometry = &geometry;
  }
  DeviceInts qo, kv_indptr, last_page_len;
  DLTensor qo_t{};
  sieve_geometry geometry;
  sieve_paged_kv view{};
  sieve_layer_call call{};
};

// A selection whose CSR storage is on the device, poisoned.
struct DeviceSelection {
  DeviceSelection(int64_t max_rows, int64_t capacity)
      : indptr(std::vector<int32_t>(size_t(max_rows + 1), kSelectionPoison)),
        indices(std::vector<int32_t>(size_t(capacity), kSelectionPoison)) {
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel.kind = SIEVE_SEL_ALL;
    sel.q_block = 1;
    sel.k_block_pages = 1;
    sel.indptr = indptr.tensor();
    sel.indices = indices.tensor();
    sel.capacity = capacity;
  }
  DeviceInts indptr, indices;
  sieve_selection sel{};
};

class StreamingCuda : public CudaPolicyTest {
 protected:
  StreamingCuda() : CudaPolicyTest("streaming") {}
  sieve_policy* create(const sieve_geometry& g, int64_t sink, int64_t window) {
    const sieve_param_value v[2] = {{SIEVE_PARAM_INT, sink, 0, nullptr, nullptr, 0},
                                    {SIEVE_PARAM_INT, window, 0, nullptr, nullptr, 0}};
    return create_policy(g, v, 2);
  }
  // CUDA lists == CPU lists == reference, and nothing past them was written.
  void compare(StreamingScenario& sc, int64_t sink, int64_t window) {
    SCOPED_TRACE(::testing::Message() << (sc.decode() ? "decode" : "prefill") << " page_size="
                                      << sc.geometry.page_size << " sink=" << sink
                                      << " window=" << window << " batch=" << sc.cases.size());
    DeviceCall dc(sc);
    sieve_policy* cpu = create(sc.geometry, sink, window);
    sieve_policy* gpu = create(dc.geometry, sink, window);
    ASSERT_TRUE(cpu && gpu);
    const auto expected = sc.reference(sink, window);
    const int64_t capacity = total_entries(expected) + 7;
    HostSelection host_sel(sc.rows() + 2, capacity);
    DeviceSelection dev_sel(sc.rows() + 2, capacity);
    uint32_t stats = SIEVE_STATS_NONE;
    ASSERT_EQ(api_->select(cpu, sc.call->get(), host_sel.get(), &stats), SIEVE_OK)
        << api_->last_error(cpu);
    ASSERT_EQ(api_->select(gpu, &dc.call, &dev_sel.sel, &stats), SIEVE_OK) << api_->last_error(gpu);
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    const std::vector<int32_t> indptr = dev_sel.indptr.read(), indices = dev_sel.indices.read();
    expect_selection_is(dev_sel.sel, indptr, indices, expected, sc.decode(), sc.geometry.page_size);
    EXPECT_EQ(indptr, host_sel.indptr());
    EXPECT_EQ(indices, host_sel.indices());
  }
};

TEST_F(StreamingCuda, DecodeMatchesTheCpuPath) {
  for (int32_t P : {1, 4, 16}) {
    StreamingScenario sc(P, {{1, 1}, {P, 1}, {P + 1, 1}, {3 * P, 1}, {37, 1}, {150, 1}},
                         SIEVE_PHASE_DECODE);
    for (int64_t sink : {0, 4, 6})
      for (int64_t window : {1, 5, 33, 4096}) compare(sc, sink, window);
  }
}

TEST_F(StreamingCuda, PrefillMatchesTheCpuPath) {
  for (int32_t P : {1, 4, 16}) {
    StreamingScenario sc(P, {{1, 1}, {P + 1, P + 1}, {40, 13}, {64, 64}, {9, 0}, {97, 31}},
                         SIEVE_PHASE_PREFILL);
    for (int64_t sink : {0, 4, 6})
      for (int64_t window : {1, 5, 33, 4096}) compare(sc, sink, window);
  }
}

TEST_F(StreamingCuda, MoreSequencesAndRowsThanOneScanChunk) {
  std::vector<StreamingCase> decode, prefill;
  for (int32_t b = 0; b < 300; ++b) decode.push_back({1 + (b * 37) % 200, 1});
  for (int32_t b = 0; b < 6; ++b) prefill.push_back({60 + 11 * b, 50 + 3 * b});
  prefill.push_back({5, 0});
  StreamingScenario d(4, decode, SIEVE_PHASE_DECODE);
  compare(d, 4, 9);
  StreamingScenario p(1, prefill, SIEVE_PHASE_PREFILL);  // page 1: > 300 rows
  ASSERT_GT(p.rows(), 256);
  compare(p, 2, 7);
}

TEST_F(StreamingCuda, CreateAllocatesScratchOnceAndSelectNever) {
  StreamingScenario sc(4, {{12, 1}, {30, 1}}, SIEVE_PHASE_DECODE);
  DeviceCall dc(sc);
  EXPECT_CALL(host_, alloc(::testing::Field(&DLDevice::device_type, kDLCUDA),
                           (size_t(dc.geometry.max_batch) + 1) * sizeof(int32_t), _))
      .Times(1);
  sieve_policy* p = create(dc.geometry, 4, 8);
  ASSERT_NE(p, nullptr);
  EXPECT_CALL(host_, alloc).Times(0);
  EXPECT_CALL(host_, free).Times(0);
  DeviceSelection sel(4, 64);
  uint32_t stats = 0;
  for (int step = 0; step < 3; ++step)
    ASSERT_EQ(api_->select(p, &dc.call, &sel.sel, &stats), SIEVE_OK) << api_->last_error(p);
  SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
  ::testing::Mock::VerifyAndClearExpectations(&host_);  // destroy (TearDown) frees the scratch
}

TEST_F(StreamingCuda, OverflowAndWrongDevicesAreRefusedBeforeAnyLaunch) {
  StreamingScenario sc(4, {{40, 13}, {23, 23}}, SIEVE_PHASE_PREFILL);
  DeviceCall dc(sc);
  sieve_policy* p = create(dc.geometry, 4, 8);
  ASSERT_NE(p, nullptr);
  const int64_t nnz = total_entries(sc.reference(4, 8));
  uint32_t stats = 0;
  {
    DeviceSelection sel(sc.rows(), nnz - 1);
    EXPECT_EQ(api_->select(p, &dc.call, &sel.sel, &stats), SIEVE_ERR_CAPACITY);
    EXPECT_THAT(api_->last_error(p), HasSubstr("its capacity is " + std::to_string(nnz - 1)));
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    for (int32_t v : sel.indptr.read()) EXPECT_EQ(v, kSelectionPoison);
    for (int32_t v : sel.indices.read()) EXPECT_EQ(v, kSelectionPoison);
  }
  {
    HostSelection sel(sc.rows(), nnz);  // host storage for a CUDA policy
    EXPECT_EQ(api_->select(p, &dc.call, sel.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(api_->last_error(p), HasSubstr("is on cpu, the policy runs on cuda:0"));
  }
  {
    DeviceSelection sel(sc.rows(), nnz);
    sieve_layer_call call = *sc.call->get();  // qo_indptr and the view still on the host
    call.geometry = &dc.geometry;
    EXPECT_EQ(api_->select(p, &call, &sel.sel, &stats), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(api_->last_error(p), HasSubstr("qo_indptr must be a contiguous int32"));
  }
}

}  // namespace
