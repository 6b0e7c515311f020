// LayerRunner's CUDA graphs (layer_graph.hpp): a decode run with graphs on gives bit for bit the
// outputs of the same run done eagerly, step after step, over a ragged batch whose sequences
// cross page boundaries at different steps (each one a new key: the call is captured again);
// calls of chains at cuda_graph full are replayed, those of static_shapes chains run eagerly
// with the reason said; a layer whose call changes at every step stops capturing. Without a GPU
// only the reasons are checked (on the CPU).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/runtime/session.hpp"
#include "sieve/util/tensor.hpp"

using namespace sieve;
using namespace sieve::runtime;
using ::testing::HasSubstr;

namespace {

constexpr int32_t kLayers = 2, kHq = 8, kHkv = 2, kD = 128, kPage = 16;

sieve_geometry geometry(DLDevice device, int32_t max_batch = 4) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = kLayers;
  g.n_q_heads = kHq;
  g.n_kv_heads = kHkv;
  g.head_dim = kD;
  g.page_size = kPage;
  g.max_batch = max_batch;
  g.max_seq_len = 512;
  g.kv_dtype = kBF16;
  g.device = device;
  g.rope_theta = 10000.f;
  g.rope_dim = kD;
  return g;
}

ResolvedChains resolve(const std::string& text, const sieve_geometry& g) {
  static Registry* reg = [] {
    auto* r = new Registry;
    r->add_directory(SIEVE_PLUGIN_DIR);
    return r;
  }();
  ChainSpec spec;
  std::string err;
  if (!text.empty()) {
    EXPECT_TRUE(parse_chain_argument(text, &spec, &err)) << err;
  }
  ResolvedChains rc;
  std::vector<std::string> errors;
  EXPECT_TRUE(resolve_chains(spec, *reg, g, &rc, &errors)) << ::testing::PrintToString(errors);
  return rc;
}

// A device tensor the test owns (the same address every step, as an engine's static buffers).
struct DeviceTensor {
  HostServices& services;
  std::vector<int64_t> shape;
  DLDataType dtype;
  void* data = nullptr;
  DLTensor t{};
  DeviceTensor(HostServices& s, std::vector<int64_t> shp, DLDataType dt) : services(s), shape(std::move(shp)), dtype(dt) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data = services.device_memory().alloc(size_t(n) * dtype_bytes(dt));
    t = make_view(data, services.device(), dt, int32_t(shape.size()), shape.data());
  }
  ~DeviceTensor() { services.device_memory().free(data); }
  size_t bytes() const { return size_t(numel(t)) * dtype_bytes(dtype); }
  void upload(const std::vector<unsigned char>& host) {
    std::string err;
    ASSERT_TRUE(services.copy(data, services.device(), host.data(), kCpu, bytes(), &err)) << err;
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> host(bytes());
    std::string err;
    EXPECT_TRUE(services.copy(host.data(), kCpu, data, services.device(), bytes(), &err)) << err;
    return host;
  }
};

std::vector<unsigned char> random_bf16(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal;
  std::vector<unsigned char> out(size_t(n) * 2);
  for (int64_t i = 0; i < n; ++i) store_float(out.data(), kBF16, i, normal(rng));
  return out;
}

// One session run through a decode of `steps` steps after ragged prompts; the last layer's
// output of every step, as bytes.
struct DecodeRun {
  std::vector<std::vector<unsigned char>> outputs;
  LayerGraphs::Counts counts;
  std::vector<std::string> reasons;
};

DecodeRun decode_run(HostServices& services, const std::string& chain, bool graphs, int steps,
                     const std::vector<int32_t>& prompt = {37, 100, 5}) {  // pages start at different steps
  const sieve_geometry g = geometry(services.device(), int32_t(prompt.size()));
  Session::Options o;
  o.runner.check = false;  // check mode copies to the host: never graphed
  o.runner.cuda_graphs = graphs;
  Session session(services, g, resolve(chain, g), o);
  LayerRunner& runner = session.runner();
  const int32_t batch = int32_t(prompt.size());
  std::vector<int32_t> ids;
  for (int32_t b = 0; b < batch; ++b) ids.push_back(session.add_sequence());
  std::mt19937 rng(7);

  // The prompts enter through append_only (the same tokens in both runs: same seed).
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t n = prompt[size_t(b)];
    DeviceTensor k(services, {n, kHkv, kD}, kBF16), v(services, {n, kHkv, kD}, kBF16);
    DeviceTensor qo(services, {2}, kI32);
    std::vector<int32_t> qo_host = {0, n};
    std::vector<int32_t> positions(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) positions[size_t(i)] = i;
    std::vector<unsigned char> qo_bytes(8);
    std::memcpy(qo_bytes.data(), qo_host.data(), 8);
    qo.upload(qo_bytes);
    for (int32_t L = 0; L < kLayers; ++L) {
      k.upload(random_bf16(rng, numel(k.t)));
      v.upload(random_bf16(rng, numel(v.t)));
      LayerInputs in;
      in.layer = L;
      in.phase = SIEVE_PHASE_DECODE;
      in.batch = 1;
      in.seq_ids = &ids[size_t(b)];
      in.qo_indptr_host = qo_host.data();
      in.qo_indptr = &qo.t;
      in.positions_host = positions.data();
      in.k = &k.t;
      in.v = &v.t;
      std::string err;
      EXPECT_EQ(runner.append_only(in, &err), SIEVE_OK) << err;
    }
  }
  std::string err;
  EXPECT_EQ(runner.end_step(SIEVE_PHASE_DECODE, 0, ids.data(), batch, &err), SIEVE_OK) << err;

  DeviceTensor q(services, {batch, kHq, kD}, kBF16), out(services, {batch, kHq, kD}, kBF16);
  DeviceTensor k(services, {batch, kHkv, kD}, kBF16), v(services, {batch, kHkv, kD}, kBF16);
  DeviceTensor qo(services, {batch + 1}, kI32);
  std::vector<int32_t> qo_host(size_t(batch) + 1);
  for (int32_t b = 0; b <= batch; ++b) qo_host[size_t(b)] = b;
  std::vector<unsigned char> qo_bytes(qo_host.size() * 4);
  std::memcpy(qo_bytes.data(), qo_host.data(), qo_bytes.size());
  qo.upload(qo_bytes);
  std::vector<int32_t> len = prompt;
  DecodeRun run;
  for (int s = 1; s <= steps; ++s) {
    for (int32_t L = 0; L < kLayers; ++L) {
      q.upload(random_bf16(rng, numel(q.t)));
      k.upload(random_bf16(rng, numel(k.t)));
      v.upload(random_bf16(rng, numel(v.t)));
      LayerInputs in;
      in.layer = L;
      in.phase = SIEVE_PHASE_DECODE;
      in.step = uint64_t(s);
      in.batch = batch;
      in.seq_ids = ids.data();
      in.qo_indptr_host = qo_host.data();
      in.qo_indptr = &qo.t;
      in.positions_host = len.data();
      in.q = &q.t;
      in.k = &k.t;
      in.v = &v.t;
      EXPECT_EQ(runner.run_layer(in, &out.t, &err), SIEVE_OK) << err;
    }
    EXPECT_EQ(runner.end_step(SIEVE_PHASE_DECODE, uint64_t(s), ids.data(), batch, &err), SIEVE_OK) << err;
    run.outputs.push_back(out.download());
    for (auto& l : len) ++l;
  }
  run.counts = runner.graph_counts();
  for (int32_t L = 0; L < kLayers; ++L) run.reasons.push_back(runner.graph_eager_reason(L));
  return run;
}

}  // namespace

TEST(LayerGraphs, CudaGraphedDecodeIsBitIdenticalToEager) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  HostServices services(DLDevice{kDLCUDA, 0});
  const int steps = 40;  // 2-3 page boundaries per sequence, at different steps
  struct Case {
    std::string chain;
    bool replayed;  // cuda_graph full: calls within a page are replays
  };
  for (const Case& c : {Case{"", true}, Case{"*=dense", true}, Case{"decode:*=quest(token_budget=64)", false},
                        Case{"*=streaming(sink=4,window=32)", false}}) {
    SCOPED_TRACE("chain '" + c.chain + "'");
    const DecodeRun eager = decode_run(services, c.chain, false, steps);
    const DecodeRun graphed = decode_run(services, c.chain, true, steps);
    ASSERT_EQ(eager.outputs.size(), size_t(steps));
    ASSERT_EQ(graphed.outputs.size(), size_t(steps));
    for (int s = 0; s < steps; ++s) EXPECT_TRUE(eager.outputs[size_t(s)] == graphed.outputs[size_t(s)]) << "step " << s + 1;
    EXPECT_EQ(eager.counts.replays + eager.counts.captures, 0u);
    if (c.replayed) {
      for (const auto& r : graphed.reasons) EXPECT_EQ(r, "");
      // Per layer: the first call eager, then a capture per distinct key (a page boundary of
      // any of the 3 sequences: at most 3 per 16 steps), replays for the rest.
      EXPECT_GE(graphed.counts.captures, uint64_t(kLayers));
      EXPECT_LE(graphed.counts.captures, uint64_t(kLayers) * 12);
      EXPECT_EQ(graphed.counts.replays + graphed.counts.captures, uint64_t(kLayers) * (steps - 1));
    } else {
      EXPECT_EQ(graphed.counts.replays + graphed.counts.captures, 0u);
      for (const auto& r : graphed.reasons) EXPECT_THAT(r, HasSubstr("declares cuda_graph static_shapes"));
    }
  }
}

TEST(LayerGraphs, ALayerWhoseCallChangesEveryStepStopsCapturing) {
  // 16 sequences whose lengths differ mod 16: some sequence starts a page at every step, so every
  // call has a new key. Per layer: call 1 eager, captures at calls 2-4 (the last two each within 4
  // calls of the one before), eager from call 5 on with the reason; the outputs stay eager's.
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  HostServices services(DLDevice{kDLCUDA, 0});
  std::vector<int32_t> prompt;
  for (int32_t b = 0; b < 16; ++b) prompt.push_back(40 + 17 * b);
  const int steps = 12;
  const DecodeRun eager = decode_run(services, "", false, steps, prompt);
  const DecodeRun graphed = decode_run(services, "", true, steps, prompt);
  for (int s = 0; s < steps; ++s) EXPECT_TRUE(eager.outputs[size_t(s)] == graphed.outputs[size_t(s)]) << "step " << s + 1;
  EXPECT_EQ(graphed.counts.captures, uint64_t(kLayers) * 3);
  EXPECT_EQ(graphed.counts.replays, 0u);
  for (const auto& r : graphed.reasons) EXPECT_THAT(r, HasSubstr("capturing would cost more than replays save"));
}

TEST(LayerGraphs, AttentionOnTheCpuIsNeverGraphedAndSaysWhy) {
  HostServices services(kCpu);
  sieve_geometry g = geometry(kCpu);
  g.kv_dtype = kF32;
  Session::Options o;
  o.runner.cuda_graphs = true;
  Session session(services, g, resolve("*=dense", g), o);
  for (int32_t L = 0; L < kLayers; ++L) EXPECT_EQ(session.runner().graph_eager_reason(L), "attention runs on cpu");
}
