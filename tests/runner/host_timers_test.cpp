// SIEVE_HOST_TIMERS: the layer runner reports each phase of a layer's host work (and end_step)
// as a "host_us.*" metric when switched on, and nothing when off.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "sieve/kv/paged_store.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/util/tensor.hpp"
#include "../plugins/support/layer_call.hpp"

using namespace sieve;
using namespace sieve::runtime;

namespace {

// Two decode steps of a two-layer model with an empty chain (the core kernel alone), batch 2.
std::map<std::string, HostServices::MetricSummary> run_steps() {
  HostServices services(kCpu);
  const sieve_geometry g = sieve::testing::test_geometry(16, 2, 256);  // 2 layers, 4q / 2kv, d 8
  const sieve_kv_config c = sieve::testing::test_kv_config(g, 16);
  const sieve_kv_store_api* api = kv::paged_cpu_store_api();
  sieve_kv_store* store = nullptr;
  EXPECT_EQ(api->create(services.table(), &c, &store, sieve_reason_sink{}), SIEVE_OK);
  std::vector<int32_t> ids(2), qo_host = {0, 1, 2}, positions = {0, 0};
  for (auto& id : ids) EXPECT_EQ(api->add_sequence(store, &id), SIEVE_OK);
  {
    LayerRunner runner(services, g, store, api, ResolvedChains{}, LayerRunner::Options{});
    HostTensor q({2, 4, 8}, kF32), k({2, 2, 8}, kF32), v({2, 2, 8}, kF32), out({2, 4, 8}, kF32), qo({3}, kI32);
    for (int i = 0; i < 3; ++i) qo.data<int32_t>()[i] = qo_host[size_t(i)];
    for (uint64_t step = 0; step < 2; ++step) {
      for (int32_t layer = 0; layer < 2; ++layer) {
        LayerInputs in;
        in.layer = layer;
        in.step = step;
        in.batch = 2;
        in.seq_ids = ids.data();
        in.qo_indptr_host = qo_host.data();
        in.qo_indptr = &qo.dl();
        in.positions_host = positions.data();
        in.q = &q.dl();
        in.k = &k.dl();
        in.v = &v.dl();
        std::string err;
        EXPECT_EQ(runner.run_layer(in, &out.dl(), &err), SIEVE_OK) << err;
      }
      std::string err;
      EXPECT_EQ(runner.end_step(SIEVE_PHASE_DECODE, step, ids.data(), 2, &err), SIEVE_OK) << err;
    }
  }
  api->destroy(store);
  auto m = services.metrics();
  return {m.begin(), m.end()};
}

}  // namespace

TEST(HostTimers, TheRunnerReportsEveryPhaseOnlyWhenSwitchedOn) {
  const char* phases[] = {"host_us.append", "host_us.view", "host_us.on_append", "host_us.select",
                          "host_us.attend", "host_us.correct"};
  setenv("SIEVE_HOST_TIMERS", "0", 1);
  auto off = run_steps();
  for (const char* p : phases) EXPECT_EQ(off.count(p), 0u) << p;
  EXPECT_EQ(off.count("host_us.end_step"), 0u);

  setenv("SIEVE_HOST_TIMERS", "1", 1);
  auto on = run_steps();
  unsetenv("SIEVE_HOST_TIMERS");
  for (const char* p : phases) {
    ASSERT_EQ(on.count(p), 1u) << p;
    EXPECT_EQ(on[p].count, 4u) << p << ": once per layer per step";
    EXPECT_GE(on[p].min, 0.0) << p;
  }
  ASSERT_EQ(on.count("host_us.end_step"), 1u);
  EXPECT_EQ(on["host_us.end_step"].count, 2u);
  EXPECT_GT(on["host_us.attend"].sum, 0.0) << "the core kernel runs inside the attend phase";
}
