// The deltakv plugin's CUDA path: the stage 1-2 kernels give bit-for-bit the CPU's keep masks,
// anchors, reach and counts (same summation order) — on keys in runs and on the realistic long
// contexts of reference/long_context.hpp, where decisions near the threshold do occur; the attend
// hook on CUDA gives the CPU hook's output (f32, bf16; head_dim 8, 64, 128; ablations; a ragged
// batch with a chunked prefill and a sequence without queries), writes no NaN, allocates nothing,
// and report=on delivers kv_reduction. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "common/attention_tolerance.hpp"
#include "cpu/deltakv_cpu.hpp"
#include "cuda/deltakv_cuda.hpp"
#include "deltakv_scenario.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/reference/page_pool.hpp"
#include "sieve/runtime/host_services.hpp"
#include "support/cuda_device.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
namespace dk = sieve::deltakv;
namespace tolerance = sieve::tolerance;

constexpr DLDevice kCuda0{kDLCUDA, 0};

// A device copy of a host tensor (same shape and dtype); `poison` fills it with 0xff bytes (NaN
// in every float dtype) instead.
struct DeviceTensor {
  DeviceTensor(const DLTensor& host, bool poison = false) : shape(host.shape, host.shape + host.ndim) {
    bytes = size_t(sieve::numel(host)) * sieve::dtype_bytes(host.dtype);
    cudaMalloc(&ptr, std::max<size_t>(bytes, 1));
    // The memset is asynchronous on the legacy stream, which the plugin's non-blocking stream
    // does not wait for: synchronise, or it can land after the kernel's writes.
    if (poison) cudaMemset(ptr, 0xff, bytes), cudaDeviceSynchronize();
    else cudaMemcpy(ptr, host.data, bytes, cudaMemcpyHostToDevice), cudaDeviceSynchronize();
    t = sieve::make_view(ptr, kCuda0, host.dtype, host.ndim, shape.data());
  }
  ~DeviceTensor() { cudaFree(ptr); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  void read_into(DLTensor& host) const { cudaMemcpy(host.data, ptr, bytes, cudaMemcpyDeviceToHost); }
  std::vector<int64_t> shape;
  void* ptr = nullptr;
  size_t bytes = 0;
  DLTensor t{};
};

// The scenario's call with every tensor on the device (host mirrors unchanged). With a `pool`, K
// and V are its engine-layout copy (strided views over one device buffer).
struct DeviceCall {
  explicit DeviceCall(DkvScenario& sc, const sieve::reference::LaidOutPool* pool = nullptr)
      : q(sc.w.q.dl()), out(sc.w.out.dl(), true), qo(sc.w.qo_indptr.dl()), k(sc.w.k_pages.dl()),
        v(sc.w.v_pages.dl()), indptr(sc.w.kv_indptr.dl()), indices(sc.w.kv_indices.dl()),
        last(sc.w.kv_last_page_len.dl()) {
    geometry = sc.geometry;
    geometry.device = kCuda0;
    view = sc.w.kv;
    view.k_pages = k.t;
    view.v_pages = v.t;
    if (pool) {
      pool_mem = std::make_unique<DeviceTensor>(pool->storage.dl());
      view.k_pages = pool->k_view(pool_mem->t);
      view.v_pages = pool->v_view(pool_mem->t);
    }
    view.indptr = indptr.t;
    view.indices = indices.t;
    view.last_page_len = last.t;
    call = sc.call();
    call.qo_indptr = &qo.t;
    call.q = &q.t;
    call.kv_view = &view;
    call.geometry = &geometry;
  }
  DeviceTensor q, out, qo, k, v, indptr, indices, last;
  std::unique_ptr<DeviceTensor> pool_mem;
  sieve_geometry geometry{};
  sieve_paged_kv view{};
  sieve_layer_call call{};
};

// Stages 1-2 on the device (kernels compiled into this test) vs the CPU functions.
void check_pack(DkvScenario& sc, const DkvOpts& o, int32_t layer = 1) {
  SCOPED_TRACE(::testing::Message() << "d=" << sc.geometry.head_dim << " chunk=" << o.chunk << " l2=" << o.l2
                                    << " packing=" << o.packing << " threshold=" << o.threshold);
  DeviceCall dc(sc);
  const sieve_geometry& g = sc.geometry;
  const size_t seqs = size_t(g.max_batch) * g.n_kv_heads, slots = seqs * size_t(g.max_seq_len);
  const int32_t chunks = int32_t((g.max_seq_len + o.chunk - 1) / o.chunk);
  uint8_t* keep = nullptr;
  int32_t *chunk_anchors = nullptr, *anchor = nullptr, *reach = nullptr, *n_anchors = nullptr,
          *anchor_page = nullptr;
  SIEVE_CUDA_OK(cudaMalloc(&keep, slots));
  SIEVE_CUDA_OK(cudaMalloc(&chunk_anchors, seqs * chunks * 4));
  SIEVE_CUDA_OK(cudaMalloc(&anchor, slots * 4));
  SIEVE_CUDA_OK(cudaMalloc(&reach, slots * 4));
  SIEVE_CUDA_OK(cudaMalloc(&anchor_page, slots * 4));
  SIEVE_CUDA_OK(cudaMalloc(&n_anchors, seqs * 4));
  SIEVE_CUDA_OK(cudaMemset(anchor, 0xff, slots * 4));
  SIEVE_CUDA_OK(cudaMemset(reach, 0xff, slots * 4));
  SIEVE_CUDA_OK(cudaMemset(n_anchors, 0xff, seqs * 4));
  dk::CudaLaunch a{};
  a.qo_indptr = static_cast<const int32_t*>(dc.qo.ptr);
  a.kv_indptr = static_cast<const int32_t*>(dc.indptr.ptr);
  a.last_page_len = static_cast<const int32_t*>(dc.last.ptr);
  a.kv_indices = static_cast<const int32_t*>(dc.indices.ptr);
  a.kv_indices_len = dc.indices.shape[0];
  a.k = dc.k.ptr;
  a.v = dc.v.ptr;
  a.kv_strides = sieve::compact_hnd_strides(g.n_kv_heads, g.page_size, g.head_dim);  // the workload's pool
  a.page_capacity = dc.k.shape[0];
  a.kv_dt = sieve::require_storage(g.kv_dtype, "the scenario's KV pages");
  a.batch = sc.w.batch;
  a.hq = g.n_q_heads;
  a.hkv = g.n_kv_heads;
  a.d = g.head_dim;
  a.page_size = g.page_size;
  a.max_seq_len = g.max_seq_len;
  a.layer = layer;
  a.max_kv_len = g.max_seq_len;
  a.keep_rule = keep_rule(o);
  a.keep = keep;
  a.chunk_anchors = chunk_anchors;
  a.anchor = anchor;
  a.reach = reach;
  a.anchor_page = anchor_page;
  a.n_anchors = n_anchors;
  a.stream = nullptr;
  ASSERT_EQ(dk::launch_deltakv_pack(a), nullptr);
  SIEVE_CUDA_OK(cudaDeviceSynchronize());
  std::vector<int32_t> h_anchor(slots), h_reach(slots), h_n(seqs), h_page(slots);
  SIEVE_CUDA_OK(cudaMemcpy(h_page.data(), anchor_page, slots * 4, cudaMemcpyDeviceToHost));
  SIEVE_CUDA_OK(cudaMemcpy(h_anchor.data(), anchor, slots * 4, cudaMemcpyDeviceToHost));
  SIEVE_CUDA_OK(cudaMemcpy(h_reach.data(), reach, slots * 4, cudaMemcpyDeviceToHost));
  SIEVE_CUDA_OK(cudaMemcpy(h_n.data(), n_anchors, seqs * 4, cudaMemcpyDeviceToHost));
  for (int32_t b = 0; b < sc.w.batch; ++b)
    for (int32_t kvh = 0; kvh < g.n_kv_heads; ++kvh) {
      const int32_t n = sc.w.kv_len[size_t(b)];
      const std::vector<float> k = sc.keys_f32(b, kvh);
      std::vector<uint8_t> keep_cpu(size_t(n) + 1);
      std::vector<int32_t> anchor_cpu(size_t(n) + 1), reach_cpu(size_t(n) + 1);
      dk::keep_mask(a.keep_rule, layer, kvh, k.data(), n, g.head_dim, keep_cpu.data());
      const int32_t m = dk::pack(keep_cpu.data(), n, anchor_cpu.data(), reach_cpu.data());
      const size_t s = size_t(b) * g.n_kv_heads + kvh;
      ASSERT_EQ(h_n[s], m) << "b=" << b << " kvh=" << kvh;
      for (int32_t j = 0; j < m; ++j) {
        ASSERT_EQ(h_anchor[s * g.max_seq_len + j], anchor_cpu[size_t(j)]) << "b=" << b << " kvh=" << kvh << " j=" << j;
        ASSERT_EQ(h_reach[s * g.max_seq_len + j], reach_cpu[size_t(j)]) << "b=" << b << " kvh=" << kvh << " j=" << j;
        const int32_t P = g.page_size, pos = anchor_cpu[size_t(j)];
        ASSERT_EQ(h_page[s * g.max_seq_len + j],
                  sc.w.kv_indices.data<int32_t>()[sc.w.kv_indptr.data<int32_t>()[b] + pos / P]);
      }
    }
  cudaFree(keep);
  cudaFree(chunk_anchors);
  cudaFree(anchor);
  cudaFree(reach);
  cudaFree(anchor_page);
  cudaFree(n_anchors);
}

class DeltaKvCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = cuda_skip_reason(); !why.empty()) GTEST_SKIP() << why;
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
    ASSERT_TRUE(api_->descriptor->devices & SIEVE_DEVICE_CUDA);
    gpu_ = std::make_unique<sieve::runtime::HostServices>(kCuda0);
  }
  void TearDown() override {
    for (sieve_policy* p : policies_) api_->destroy(p);
  }
  sieve_policy* create(const sieve::runtime::HostServices& host, const sieve_geometry& g, const DkvOpts& o) {
    DkvValues v(o);
    sieve_policy* p = create_or_fail(api_, host.table(), g, v.v, DkvValues::kN);
    if (p) policies_.push_back(p);
    return p;
  }
  // The CUDA hook's output vs the CPU hook's on the same scenario.
  void check(const DkvOpts& o, DLDataType dtype, int32_t d) {
    DkvScenario sc(dtype, d);
    check(o, sc);
  }
  void check(const DkvOpts& o, DkvScenario& sc) {
    SCOPED_TRACE(::testing::Message() << "d=" << sc.geometry.head_dim << " dtype="
                                      << sieve::dtype_name(sc.geometry.kv_dtype) << " threshold=" << o.threshold
                                      << " chunk=" << o.chunk << " q_block=" << o.q_block
                                      << " cw=" << o.count_weighting << " phase2=" << o.phase2
                                      << " packing=" << o.packing);
    sieve_policy* cpu = create(cpu_, sc.geometry, o);
    ASSERT_NE(cpu, nullptr);
    sieve_selection sel{};
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel.kind = SIEVE_SEL_ALL;
    sieve_layer_call c = sc.call();
    ASSERT_EQ(api_->attend(cpu, &c, &sel, &sc.w.out.dl()), SIEVE_OK) << api_->last_error(cpu);
    const std::vector<double> want = sc.output();

    DeviceCall dc(sc);
    sieve_policy* gpu = create(*gpu_, dc.geometry, o);
    ASSERT_NE(gpu, nullptr);
    const uint64_t allocs = gpu_->allocation_count();
    ASSERT_EQ(api_->attend(gpu, &dc.call, &sel, &dc.out.t), SIEVE_OK) << api_->last_error(gpu);
    EXPECT_EQ(gpu_->allocation_count(), allocs) << "the attend hook must not allocate";
    std::string error;
    ASSERT_TRUE(gpu_->synchronize(&error)) << error;
    sc.w.poison_outputs();
    dc.out.read_into(sc.w.out.dl());
    double err = 0;
    const std::string where = DkvScenario::worst(sc.output(), want, &err);
    // Each within the arithmetic's bound of the exact result: the CPU sums in f32; CUDA too, and
    // with 16-bit q and K/V its tensor cores round the softmax weights to that dtype for P.V.
    const DLDataType kv = sc.w.spec.kv_dtype;
    const double u16 = kv.bits == 16 ? tolerance::unit_roundoff(kv) : 0;
    EXPECT_LT(err, tolerance::attention_bound(sc.w).element +
                       tolerance::attention_bound(sc.w, tolerance::kF32, u16).element)
        << where;
  }

  PluginLibrary& lib_ = deltakv_library();
  const sieve_policy_api* api_ = nullptr;
  sieve::runtime::HostServices cpu_{sieve::kCpu};
  std::unique_ptr<sieve::runtime::HostServices> gpu_;
  std::vector<sieve_policy*> policies_;
};

TEST(DeltaKvCudaPack, KeepMasksAndPacksMatchTheCpuBitForBit) {
  if (const std::string why = cuda_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (int32_t d : {8, 40, 64, 128}) {
    DkvScenario sc(sieve::kF32, d);
    std::vector<DkvOpts> cases(5);
    cases[1].l2 = true;
    cases[1].threshold = 1.0;
    cases[2].chunk = 7;
    cases[3].packing = 1;
    cases[3].chunk = 33;
    cases[4].packing = 2;
    cases[4].reduction = 0.6;
    cases[4].seed = 5;
    for (const DkvOpts& o : cases) check_pack(sc, o);
  }
  DkvScenario bf(sieve::kBF16, 64);
  check_pack(bf, DkvOpts{});
}

// Realistic adjacency (cosines spread around the thresholds): the same summation order must give
// the same decisions even where they are close.
TEST(DeltaKvCudaPack, LongContextPacksMatchTheCpuBitForBit) {
  if (const std::string why = cuda_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  DkvScenario sc(sieve::kF32, 128, {2048, 1500}, {2048, 1500}, 3, 16, 8, 4);
  sieve::reference::LongContextSpec spec;
  spec.n_q_heads = 8;
  spec.n_kv_heads = 4;
  spec.head_dim = 128;
  sieve::reference::fill_workload(sc.w, spec);
  for (double t : {0.78, 0.83, 0.88}) {
    DkvOpts o;
    o.threshold = t;
    check_pack(sc, o);
  }
  DkvOpts c128;
  c128.chunk = 128;
  check_pack(sc, c128);
}

TEST_F(DeltaKvCuda, AttendMatchesTheCpu) {
  for (int32_t d : {8, 64, 128}) {
    check(DkvOpts{}, sieve::kF32, d);
    DkvOpts small;
    small.chunk = 64;
    small.q_block = 16;
    check(small, sieve::kF32, d);
    check(small, sieve::kBF16, d);
  }
}

TEST_F(DeltaKvCuda, AblationsMatchTheCpu) {
  DkvOpts o;
  o.chunk = 32;
  o.q_block = 16;
  o.count_weighting = false;
  check(o, sieve::kF32, 64);
  o.count_weighting = true;
  o.phase2 = 1;
  check(o, sieve::kF32, 64);
  o.phase2 = 2;
  check(o, sieve::kF32, 64);
  o.phase2 = 0;
  o.packing = 1;
  check(o, sieve::kF32, 8);
  o.packing = 2;
  check(o, sieve::kF32, 128);
  o.packing = 0;
  o.q_block = 1;
  check(o, sieve::kF32, 128);
}

// The tensor-core stage 3 (16-bit q and K/V, head_dim 64/128) under every option it serves, and
// the FMA fallback for 16-bit phase2=off.
// Engine page layouts (ABI 1.1 strided views): the same K/V laid out HND, NHD and as combined
// pools gives bit-identical device outputs on the tensor-core kernel (bf16, d 128) and the FMA
// one (f32).
TEST_F(DeltaKvCuda, EngineLayoutsGiveBitIdenticalOutputs) {
  for (const DLDataType dtype : {sieve::kBF16, sieve::kF32}) {
    SCOPED_TRACE(sieve::dtype_name(dtype));
    DkvOpts o;
    o.chunk = 64;
    o.q_block = 16;
    DkvScenario sc(dtype, 128);
    auto once = [&](const sieve::reference::LaidOutPool* pool) {
      DeviceCall dc(sc, pool);
      sieve_policy* gpu = create(*gpu_, dc.geometry, o);
      EXPECT_NE(gpu, nullptr);
      sieve_selection sel{};
      sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
      sel.kind = SIEVE_SEL_ALL;
      if (gpu) {
        EXPECT_EQ(api_->attend(gpu, &dc.call, &sel, &dc.out.t), SIEVE_OK) << api_->last_error(gpu);
      }
      std::string error;
      EXPECT_TRUE(gpu_->synchronize(&error)) << error;
      std::vector<unsigned char> bytes(dc.out.bytes);
      cudaMemcpy(bytes.data(), dc.out.ptr, bytes.size(), cudaMemcpyDeviceToHost);
      return bytes;
    };
    const std::vector<unsigned char> want = once(nullptr);
    for (const sieve::KvLayout layout : sieve::kKvLayouts) {
      SCOPED_TRACE(sieve::kv_layout_name(layout));
      sieve::reference::LaidOutPool pool(sc.w.k_pages.dl(), sc.w.v_pages.dl(), layout);
      EXPECT_TRUE(once(&pool) == want) << "output differs from the compact pool's";
    }
  }
}

TEST_F(DeltaKvCuda, TensorCoreOptionsMatchTheCpu) {
  DkvOpts o;
  o.chunk = 64;
  o.q_block = 16;
  o.count_weighting = false;
  check(o, sieve::kBF16, 128);
  o.count_weighting = true;
  o.phase2 = 2;  // only
  check(o, sieve::kBF16, 64);
  o.phase2 = 1;  // off: FMA kernel
  check(o, sieve::kBF16, 128);
  o.phase2 = 0;
  o.q_block = 1;
  check(o, sieve::kF16, 128);
  o.q_block = 200;  // blocks longer than a CTA's tokens
  o.packing = 2;
  check(o, sieve::kF16, 64);
}

// Realistic keys, many CTA tiles and a long compressed history through the tensor-core kernel.
TEST_F(DeltaKvCuda, LongContextAttendMatchesTheCpu) {
  DkvScenario sc(sieve::kBF16, 128, {2048, 700}, {1024, 700}, 3, 16, 8, 4);
  sieve::reference::LongContextSpec spec;
  spec.n_q_heads = 8;
  spec.n_kv_heads = 4;
  spec.head_dim = 128;
  sieve::reference::fill_workload(sc.w, spec);
  for (double t : {0.83, 0.78}) {
    DkvOpts o;
    o.threshold = t;
    check(o, sc);
  }
}

TEST_F(DeltaKvCuda, ReportOnDeliversKvReduction) {
  DkvOpts o;
  o.report = 1;  // on
  DkvScenario sc(sieve::kF32, 64);
  DeviceCall dc(sc);
  sieve_policy* gpu = create(*gpu_, dc.geometry, o);
  ASSERT_NE(gpu, nullptr);
  sieve_selection sel{};
  sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
  gpu_->clear_metrics();
  ASSERT_EQ(api_->attend(gpu, &dc.call, &sel, &dc.out.t), SIEVE_OK) << api_->last_error(gpu);
  bool found = false;
  for (const auto& [name, s] : gpu_->metrics())
    if (name == "kv_reduction") {
      found = true;
      EXPECT_EQ(s.count, 3u);
      EXPECT_GT(s.min, 0.3);
    }
  EXPECT_TRUE(found);
}

}  // namespace
