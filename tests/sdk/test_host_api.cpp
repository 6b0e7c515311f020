// The C host API (api/sieve/host.h): discovery and listing, struct_size handling, chains, sessions
// (a prefill call equals the same tokens fed one decode step at a time; eviction and removal free
// KV), and every bad input answered with a status and a message. On a GPU machine a CUDA session
// must match a CPU session on the same inputs.
// Host API 1.1's choice of KV store is tested in test_host_api_kv_store.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/host.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/tolerance.hpp"
#include "host_api_test_util.hpp"
#include "sieve/runtime/host_services.hpp"

namespace {

using ::testing::HasSubstr;
namespace tolerance = sieve::tolerance;

// The f32 rounding bound on ||o - o*|| over a whole attention output of `rows` rows of d = 64
// over at most `keys` keys: every row within softmax_sum x the largest value-row norm.
double output_bound(const float* q, int64_t q_rows, const float* k, const float* v, int64_t kv_rows,
                    int64_t keys, int64_t rows) {
  const int64_t d = 64;
  const double logit = tolerance::max_row_norm(q, q_rows, d) * tolerance::max_row_norm(k, kv_rows, d) / 8;
  return std::sqrt(double(rows)) * tolerance::softmax_sum(keys, d, logit, tolerance::kF32) *
         tolerance::max_row_norm(v, kv_rows, d);
}

using host_api_test::geometry;
using host_api_test::Runtime;
using host_api_test::with_header;

struct Tensor {  // host f32 [rows, heads, 64]
  std::vector<float> data;
  int64_t shape[3];
  DLTensor t{};
  Tensor(int64_t rows, int64_t heads, float fill = NAN) : data(size_t(rows * heads * 64), fill), shape{rows, heads, 64} {
    t.data = data.data();
    t.device = {kDLCPU, 0};
    t.ndim = 3;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
  }
  Tensor(const Tensor&) = delete;
};

// One sequence's call: its rows qo[0]..qo[1] of q/k/v.
sieve_layer_inputs one_sequence(uint32_t phase, int32_t* seq, const int32_t* qo, const DLTensor* q, const DLTensor* k,
                                const DLTensor* v, int32_t layer = 0) {
  auto in = with_header<sieve_layer_inputs>();
  in.layer = layer;
  in.phase = phase;
  in.batch = 1;
  in.seq_ids = seq;
  in.qo_indptr = qo;
  in.q = q, in.k = k, in.v = v;
  return in;
}

void randomize(Tensor& x, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : x.data) v = u(rng);
}

TEST(HostApi, VersionAndNullArguments) {
  EXPECT_EQ(sieve_host_api_version() >> 16, SIEVE_HOST_API_MAJOR);
  EXPECT_EQ(sieve_runtime_create(nullptr, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(sieve_runtime_plugin_count(nullptr, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(sieve_session_attend(nullptr, nullptr, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  sieve_runtime_destroy(nullptr);  // accepted
  sieve_session_destroy(nullptr);
  sieve_chain_destroy(nullptr);
  auto bad = with_header<sieve_runtime_options>();
  bad.hdr.struct_size = 4;  // smaller than a header
  sieve_runtime* rt = nullptr;
  EXPECT_EQ(sieve_runtime_create(&bad, &rt), SIEVE_ERR_VERSION);
  EXPECT_EQ(rt, nullptr);
}

TEST(HostApi, ListsPluginsAndFailures) {
  Runtime r;
  EXPECT_EQ(sieve_runtime_add_plugin_dir(r.rt, "/nonexistent/dir"), SIEVE_ERR_NOT_FOUND);
  EXPECT_THAT(r.error(), HasSubstr("/nonexistent/dir"));
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_FIXTURE_DIR), SIEVE_OK);
  auto names = r.names();
  EXPECT_THAT(names, ::testing::Contains("minimal"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("wrong_major")));
  uint32_t failures = 0;
  ASSERT_EQ(sieve_runtime_failure_count(r.rt, &failures), SIEVE_OK);
  bool named = false;
  for (uint32_t i = 0; i < failures; ++i)
    named |= std::string(sieve_runtime_failure(r.rt, i)).find("libsieve_wrong_major.so: ABI major 2 (plugin) vs 1 (host)") == 0;
  EXPECT_TRUE(named) << "the wrong_major fixture's failure, naming both majors";
  EXPECT_STREQ(sieve_runtime_failure(r.rt, failures), "");
  // A directory added once plugins are loaded is loaded at once.
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("dense")));
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  EXPECT_THAT(r.names(), ::testing::Contains("dense"));
  auto info = with_header<sieve_plugin_info>();
  EXPECT_EQ(sieve_runtime_plugin_info(r.rt, 1000, &info), SIEVE_ERR_NOT_FOUND);
}

TEST(HostApi, DefaultSearchPathFindsTheBuildPlugins) {
  Runtime r(SIEVE_RUNTIME_NO_ENV);  // next to the executable / the library: build/lib/sieve/plugins
  EXPECT_THAT(r.names(), ::testing::IsSupersetOf({"dense", "streaming"}));
}

TEST(HostApi, PluginInfoHonoursAnOlderCallerStruct) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_FIXTURE_DIR), SIEVE_OK);
  uint32_t n = 0;
  ASSERT_EQ(sieve_runtime_plugin_count(r.rt, &n), SIEVE_OK);
  uint32_t idx = 0;
  for (; idx < n; ++idx) {
    auto info = with_header<sieve_plugin_info>();
    sieve_runtime_plugin_info(r.rt, idx, &info);
    if (std::string(info.name) == "minimal") {
      EXPECT_EQ(info.n_params, 6u);
      EXPECT_EQ(info.params_stride, sizeof(sieve_param_spec));
      ASSERT_NE(info.descriptor, nullptr);
      EXPECT_STREQ(info.descriptor->vendor, "sieve_test");
      EXPECT_STREQ(reinterpret_cast<const sieve_param_spec*>(reinterpret_cast<const char*>(info.params) +
                                                            5 * info.params_stride)->name, "weights");
      break;
    }
  }
  ASSERT_LT(idx, n);
  // A caller compiled when the struct ended before `descriptor`: nothing past it is written.
  auto info = with_header<sieve_plugin_info>();
  std::memset(&info, 0xAB, sizeof info);
  info.hdr.struct_size = uint32_t(offsetof(sieve_plugin_info, descriptor));
  ASSERT_EQ(sieve_runtime_plugin_info(r.rt, idx, &info), SIEVE_OK);
  EXPECT_STREQ(info.name, "minimal");
  EXPECT_EQ(info.hdr.struct_size, offsetof(sieve_plugin_info, descriptor));
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&info) + offsetof(sieve_plugin_info, descriptor);
  for (size_t i = 0; i < sizeof info - offsetof(sieve_plugin_info, descriptor); ++i) ASSERT_EQ(tail[i], 0xAB) << i;
}

TEST(HostApi, ChainsAndSessionErrors) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  sieve_chain* c = nullptr;
  EXPECT_EQ(sieve_chain_parse(r.rt, "decode:*=streaming(", &c), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  EXPECT_THAT(r.error(), HasSubstr("chain spec, col"));
  EXPECT_EQ(sieve_chain_load_file(r.rt, "/nonexistent/chain.txt", &c), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_FALSE(r.error().empty());

  const std::string file = ::testing::TempDir() + "/sieve_host_api_chain.txt";
  std::ofstream(file) << "# a comment\ndecode:1 = streaming(window=32)\n";
  ASSERT_EQ(sieve_chain_load_file(r.rt, file.c_str(), &c), SIEVE_OK) << r.error();
  EXPECT_STREQ(sieve_chain_text(c), "decode:1=streaming(window=32)");
  sieve_geometry g = geometry();
  sieve_session* s = nullptr;
  g.n_layers = 1;  // the chain names layer 1
  EXPECT_EQ(sieve_session_create(r.rt, &g, c, nullptr, &s), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_THAT(r.error(), HasSubstr("layer"));
  g = geometry();
  g.n_q_heads = 6;
  g.n_kv_heads = 4;
  EXPECT_EQ(sieve_session_create(r.rt, &g, nullptr, nullptr, &s), SIEVE_ERR_INVALID_ARGUMENT);
  g = geometry();
  g.hdr.struct_size = 8;
  EXPECT_EQ(sieve_session_create(r.rt, &g, nullptr, nullptr, &s), SIEVE_ERR_VERSION);
  sieve_chain_destroy(c);
  ASSERT_EQ(sieve_chain_parse(r.rt, "decode:*=streaming(windw=3)", &c), SIEVE_OK);
  g = geometry();
  EXPECT_EQ(sieve_session_create(r.rt, &g, c, nullptr, &s), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("windw"));
  sieve_chain_destroy(c);
}

// Runs `tokens` tokens of one sequence through a 2-layer session, either as one prefill call or
// prefill of 1 token then decode steps; returns every output row in token order, per layer.
std::vector<float> run_one_sequence(sieve_session* s, const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, int32_t tokens, bool one_call) {
  int32_t seq = -1;
  EXPECT_EQ(sieve_session_add_sequence(s, &seq), SIEVE_OK);
  std::vector<float> out(size_t(2) * tokens * 8 * 64, NAN);
  const size_t qrow = 8 * 64, krow = 2 * 64;
  int32_t done = 0;
  while (done < tokens) {
    const int32_t n = one_call ? tokens : 1;
    const uint32_t phase = (one_call || done == 0) ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
    for (int32_t layer = 0; layer < 2; ++layer) {
      int64_t qs[3] = {n, 8, 64}, ks[3] = {n, 2, 64};
      const size_t lq = size_t(layer) * tokens * qrow, lk = size_t(layer) * tokens * krow;
      DLTensor tq{const_cast<float*>(q.data()) + lq + done * qrow, {kDLCPU, 0}, 3, {kDLFloat, 32, 1}, qs, nullptr, 0};
      DLTensor tk{const_cast<float*>(k.data()) + lk + done * krow, {kDLCPU, 0}, 3, {kDLFloat, 32, 1}, ks, nullptr, 0};
      DLTensor tv{const_cast<float*>(v.data()) + lk + done * krow, {kDLCPU, 0}, 3, {kDLFloat, 32, 1}, ks, nullptr, 0};
      DLTensor to{out.data() + lq + done * qrow, {kDLCPU, 0}, 3, {kDLFloat, 32, 1}, qs, nullptr, 0};
      int32_t qo[2] = {0, n};
      auto in = one_sequence(phase, &seq, qo, &tq, &tk, &tv, layer);
      EXPECT_EQ(sieve_session_attend(s, &in, &to), SIEVE_OK) << sieve_session_last_error(s);
    }
    EXPECT_EQ(sieve_session_end_step(s, phase, &seq, 1), SIEVE_OK) << sieve_session_last_error(s);
    done += n;
  }
  int32_t len = 0;
  EXPECT_EQ(sieve_session_seq_len(s, 1, seq, &len), SIEVE_OK);
  EXPECT_EQ(len, tokens);
  EXPECT_EQ(sieve_session_remove_sequence(s, seq), SIEVE_OK);
  return out;
}

TEST(HostApi, PrefillEqualsTokenByTokenDecode) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  sieve_geometry g = geometry();
  sieve_session* s = nullptr;
  ASSERT_EQ(sieve_session_create(r.rt, &g, nullptr, nullptr, &s), SIEVE_OK) << r.error();
  const int32_t T = 37;  // 3 pages, the last with 5 tokens
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(size_t(2) * T * 8 * 64), k(size_t(2) * T * 2 * 64), v(k.size());
  for (auto* x : {&q, &k, &v})
    for (float& f : *x) f = u(rng);
  auto a = run_one_sequence(s, q, k, v, T, true);
  auto b = run_one_sequence(s, q, k, v, T, false);
  double num = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i]) && std::isfinite(b[i])) << i;
    num += double(a[i] - b[i]) * (a[i] - b[i]);
  }
  // Two f32 orders (prefill tiles, per-token decode) of the same attention: twice the bound.
  EXPECT_LT(std::sqrt(num), 2 * output_bound(q.data(), int64_t(q.size()) / 64, k.data(), v.data(),
                                             int64_t(k.size()) / 64, T, int64_t(a.size()) / 64));
  uint64_t bytes = 1;
  ASSERT_EQ(sieve_session_kv_bytes(s, &bytes), SIEVE_OK);
  EXPECT_EQ(bytes, 0u) << "removed sequences hold no KV";
  EXPECT_EQ(sieve_session_cuda_stream(s), nullptr);
  EXPECT_EQ(sieve_session_synchronize(s), SIEVE_OK);
  sieve_session_destroy(s);
}

TEST(HostApi, AttendRefusesBadInput) {
  Runtime r;
  sieve_geometry g = geometry();
  sieve_session* s = nullptr;
  ASSERT_EQ(sieve_session_create(r.rt, &g, nullptr, nullptr, &s), SIEVE_OK) << r.error();
  int32_t seq = -1;
  ASSERT_EQ(sieve_session_add_sequence(s, &seq), SIEVE_OK);
  Tensor q(2, 8), k(2, 2), v(2, 2), out(2, 8);
  int32_t qo[2] = {0, 2};
  const auto good = one_sequence(SIEVE_PHASE_PREFILL, &seq, qo, &q.t, &k.t, &v.t);
  struct Case {
    const char* what;
    std::function<void(sieve_layer_inputs&, DLTensor&)> edit;
    const char* message;
  };
  Tensor wide(2, 4);
  const std::vector<Case> cases = {
      {"decode with 2 tokens", [](auto& in, auto&) { in.phase = SIEVE_PHASE_DECODE; }, "decode takes exactly 1"},
      {"layer 2", [](auto& in, auto&) { in.layer = 2; }, "layer 2"},
      {"batch 3", [](auto& in, auto&) { in.batch = 3; }, "batch 3"},
      {"unknown sequence", [](auto& in, auto&) { static int32_t bad = 99; in.seq_ids = &bad; }, "sequence id 99"},
      {"k with 4 heads", [&](auto& in, auto&) { in.k = &wide.t; }, "k must have shape [2, 2, 64]"},
      {"q on cuda", [&](auto&, auto&) { q.t.device = {kDLCUDA, 0}; }, "q is on cuda"},
      {"out of int32", [](auto&, auto& o) { o.dtype = {kDLInt, 32, 1}; }, "out must be f32, f16 or bf16"},
      {"no v", [](auto& in, auto&) { in.v = nullptr; }, "v is NULL"},
      {"phase 3", [](auto& in, auto&) { in.phase = 3; }, "phase 3"},
  };
  for (const auto& c : cases) {
    sieve_layer_inputs in = good;
    DLTensor o = out.t;
    q.t.device = {kDLCPU, 0};
    c.edit(in, o);
    EXPECT_NE(sieve_session_attend(s, &in, &o), SIEVE_OK) << c.what;
    EXPECT_THAT(std::string(sieve_session_last_error(s)), HasSubstr(c.message)) << c.what;
  }
  q.t.device = {kDLCPU, 0};
  DLTensor o = out.t;
  ASSERT_EQ(sieve_session_attend(s, &good, &o), SIEVE_OK) << sieve_session_last_error(s);
  EXPECT_STREQ(sieve_session_last_error(s), "");
  EXPECT_EQ(sieve_session_remove_sequence(s, 12345), SIEVE_ERR_NOT_FOUND);
  sieve_session_destroy(s);
}

// Strides: compact row-major is required, but the stride of an extent-1 dimension is free (a
// one-token decode tensor from PyTorch's DLPack export carries stride 1 there).
TEST(HostApi, StridesOfExtentOneDimensionsAreIgnored) {
  Runtime r;
  sieve_geometry g = geometry(1);
  sieve_session* s = nullptr;
  ASSERT_EQ(sieve_session_create(r.rt, &g, nullptr, nullptr, &s), SIEVE_OK) << r.error();
  int32_t seq = -1;
  ASSERT_EQ(sieve_session_add_sequence(s, &seq), SIEVE_OK);
  std::mt19937 rng(3);
  Tensor q(1, 8), k(1, 2), v(1, 2), out(1, 8);
  randomize(q, rng), randomize(k, rng), randomize(v, rng);
  int64_t q_strides[3] = {1, 64, 1}, kv_strides[3] = {7, 64, 1};
  q.t.strides = q_strides, k.t.strides = kv_strides, v.t.strides = kv_strides;
  int32_t qo[2] = {0, 1};
  auto in = one_sequence(SIEVE_PHASE_PREFILL, &seq, qo, &q.t, &k.t, &v.t);
  ASSERT_EQ(sieve_session_attend(s, &in, &out.t), SIEVE_OK) << sieve_session_last_error(s);
  // One key: the output is that key's value row for every head of its group.
  for (int h = 0; h < 8; ++h)
    for (int c = 0; c < 64; ++c) EXPECT_FLOAT_EQ(out.data[size_t(h * 64 + c)], v.data[size_t((h / 4) * 64 + c)]);
  int64_t bad[3] = {1, 1, 8};  // heads and channels swapped: not compact
  k.t.strides = bad;
  EXPECT_EQ(sieve_session_attend(s, &in, &out.t), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(sieve_session_last_error(s), "k must be compact row-major");
  sieve_session_destroy(s);
}

TEST(HostApi, ChainSessionDiffersFromDense) {
  // A chain reaches the plugin: streaming's window changes decode outputs, which stay finite.
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  sieve_chain* c = nullptr;
  ASSERT_EQ(sieve_chain_parse(r.rt, "decode:*=streaming(sink=16,window=16)", &c), SIEVE_OK);
  sieve_geometry g = geometry();
  sieve_session *dense = nullptr, *sparse = nullptr;
  ASSERT_EQ(sieve_session_create(r.rt, &g, nullptr, nullptr, &dense), SIEVE_OK);
  ASSERT_EQ(sieve_session_create(r.rt, &g, c, nullptr, &sparse), SIEVE_OK) << r.error();
  sieve_chain_destroy(c);  // sessions keep what they need
  const int32_t T = 70;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> q(size_t(2) * T * 8 * 64), k(size_t(2) * T * 2 * 64), v(k.size());
  for (auto* x : {&q, &k, &v})
    for (float& f : *x) f = u(rng);
  auto a = run_one_sequence(dense, q, k, v, T, false);
  auto b = run_one_sequence(sparse, q, k, v, T, false);
  double num = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(b[i])) << i;
    num += double(a[i] - b[i]) * (a[i] - b[i]);
  }
  EXPECT_GT(std::sqrt(num), 10 * output_bound(q.data(), int64_t(q.size()) / 64, k.data(), v.data(),
                                              int64_t(k.size()) / 64, T, int64_t(a.size()) / 64))
      << "the window must change decode outputs past 32 tokens, far beyond rounding";
  sieve_session_destroy(sparse);
  sieve_session_destroy(dense);
}

// A CUDA session on device tensors equals a CPU session on the same inputs, on its own stream
// and (host API 1.2) on a stream the host hands it.
class HostApiCuda : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Stream, HostApiCuda, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "CallersStream" : "OwnStream"; });

TEST_P(HostApiCuda, MatchesTheCpuSession) {
  if (sieve::runtime::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: the CUDA session is checked on a GPU machine";
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  sieve_geometry gc = geometry(2, {kDLCPU, 0}), gd = geometry(2, {kDLCUDA, 0});
  sieve_session *cpu = nullptr, *gpu = nullptr;
  // The uploads below and the host's stream come from one HostServices: its stream stands for
  // the host's (PyTorch's current stream in the Python binding).
  sieve::runtime::HostServices dev({kDLCUDA, 0});
  auto o = with_header<sieve_session_options>();
  o.check = 1;
  o.cuda_stream = GetParam() ? dev.cuda_stream() : nullptr;
  ASSERT_EQ(sieve_session_create(r.rt, &gc, nullptr, nullptr, &cpu), SIEVE_OK) << r.error();
  ASSERT_EQ(sieve_session_create(r.rt, &gd, nullptr, &o, &gpu), SIEVE_OK) << r.error();
  EXPECT_NE(sieve_session_cuda_stream(gpu), nullptr);
  if (GetParam()) EXPECT_EQ(sieve_session_cuda_stream(gpu), dev.cuda_stream());
  else EXPECT_NE(sieve_session_cuda_stream(gpu), dev.cuda_stream());
  const DLDevice cuda{kDLCUDA, 0}, host{kDLCPU, 0};
  const int32_t T = 40;
  std::mt19937 rng(11);
  Tensor q(T, 8), k(T, 2), v(T, 2), out_cpu(T, 8), out_gpu(T, 8);
  randomize(q, rng), randomize(k, rng), randomize(v, rng);
  auto upload = [&](Tensor& x) {
    const size_t bytes = x.data.size() * sizeof(float);
    void* p = dev.table()->alloc(dev.table()->host_ctx, cuda, bytes, 256);
    std::string err;
    EXPECT_TRUE(dev.copy(p, cuda, x.data.data(), host, bytes, &err)) << err;
    DLTensor t = x.t;
    t.data = p;
    t.device = cuda;
    return t;
  };
  DLTensor dq = upload(q), dk = upload(k), dv = upload(v), dout = upload(out_gpu);
  int32_t seq_c = -1, seq_g = -1;
  ASSERT_EQ(sieve_session_add_sequence(cpu, &seq_c), SIEVE_OK);
  ASSERT_EQ(sieve_session_add_sequence(gpu, &seq_g), SIEVE_OK);
  int32_t qo[2] = {0, T};
  auto in = one_sequence(SIEVE_PHASE_PREFILL, &seq_c, qo, &q.t, &k.t, &v.t);
  ASSERT_EQ(sieve_session_attend(cpu, &in, &out_cpu.t), SIEVE_OK) << sieve_session_last_error(cpu);
  in.seq_ids = &seq_g, in.q = &dq, in.k = &dk, in.v = &dv;
  ASSERT_EQ(sieve_session_attend(gpu, &in, &dout), SIEVE_OK) << sieve_session_last_error(gpu);
  ASSERT_EQ(sieve_session_synchronize(gpu), SIEVE_OK) << sieve_session_last_error(gpu);
  std::string err;
  ASSERT_TRUE(dev.copy(out_gpu.data.data(), host, dout.data, cuda, out_gpu.data.size() * sizeof(float), &err)) << err;
  double num = 0;
  for (size_t i = 0; i < out_cpu.data.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out_gpu.data[i])) << i;
    num += double(out_cpu.data[i] - out_gpu.data[i]) * (out_cpu.data[i] - out_gpu.data[i]);
  }
  // CPU and CUDA both sum in f32 (f32 inputs: no tensor cores): twice the bound.
  EXPECT_LT(std::sqrt(num), 2 * output_bound(q.data.data(), T * 8, k.data.data(), v.data.data(), T * 2, T,
                                             int64_t(out_cpu.data.size()) / 64));
  for (DLTensor* t : {&dq, &dk, &dv, &dout}) dev.table()->free(dev.table()->host_ctx, cuda, t->data);
  sieve_session_destroy(gpu);
  sieve_session_destroy(cpu);
}

// Host API 1.2: a stream is for CUDA sessions only, refused with one line on the CPU.
TEST(HostApi12, ACpuSessionRefusesACudaStream) {
  EXPECT_EQ(sieve_host_api_version(), (1u << 16) | 2u);
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  sieve_geometry g = geometry();
  auto o = with_header<sieve_session_options>();
  int not_a_stream = 0;
  o.cuda_stream = &not_a_stream;
  sieve_session* s = nullptr;
  EXPECT_EQ(sieve_session_create(r.rt, &g, nullptr, &o, &s), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_EQ(r.error(), "a CUDA stream was given for a session on cpu");
}

// Host API 1.2: without the probe process the same plugin files load (directly, trusted).
TEST(HostApi12, NoProbeLoadsTheSamePlugins) {
  Runtime probed, direct(SIEVE_RUNTIME_NO_ENV | SIEVE_RUNTIME_NO_DEFAULT_DIRS | SIEVE_RUNTIME_NO_PROBE);
  for (Runtime* r : {&probed, &direct}) ASSERT_EQ(sieve_runtime_add_plugin_dir(r->rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  const std::vector<std::string> names = probed.names();
  EXPECT_THAT(names, ::testing::Contains("dense"));
  EXPECT_EQ(direct.names(), names);
  uint32_t failures = 1;
  ASSERT_EQ(sieve_runtime_failure_count(direct.rt, &failures), SIEVE_OK);
  EXPECT_EQ(failures, 0u);
}

}  // namespace
