// What the host API tests share: options structs with their header filled in, a runtime that
// searches only the directories a test adds, and the session geometry the tests use.
#pragma once

#include <gtest/gtest.h>
#include <sieve/host.h>

#include <cstring>
#include <string>
#include <vector>

namespace host_api_test {

template <class T>
T with_header() {
  T t;
  std::memset(&t, 0, sizeof t);
  t.hdr.struct_size = sizeof(T);
  t.hdr.version = SIEVE_ABI_MINOR;
  return t;
}

struct Runtime {
  sieve_runtime* rt = nullptr;
  explicit Runtime(uint32_t flags = SIEVE_RUNTIME_NO_ENV | SIEVE_RUNTIME_NO_DEFAULT_DIRS) {
    auto o = with_header<sieve_runtime_options>();
    o.flags = flags;
    EXPECT_EQ(sieve_runtime_create(&o, &rt), SIEVE_OK);
  }
  ~Runtime() { sieve_runtime_destroy(rt); }
  std::string error() const { return sieve_runtime_last_error(rt); }
  std::vector<std::string> names() {
    uint32_t n = 0;
    EXPECT_EQ(sieve_runtime_plugin_count(rt, &n), SIEVE_OK);
    std::vector<std::string> out;
    for (uint32_t i = 0; i < n; ++i) {
      auto info = with_header<sieve_plugin_info>();
      EXPECT_EQ(sieve_runtime_plugin_info(rt, i, &info), SIEVE_OK);
      out.push_back(info.name);
    }
    return out;
  }
};

inline sieve_geometry geometry(int32_t layers = 2, DLDevice dev = {kDLCPU, 0}) {
  auto g = with_header<sieve_geometry>();
  g.n_layers = layers;
  g.n_q_heads = 8;
  g.n_kv_heads = 2;
  g.head_dim = 64;
  g.page_size = 16;
  g.max_batch = 2;
  g.max_seq_len = 128;
  g.kv_dtype = {kDLFloat, 32, 1};
  g.device = dev;
  g.rope_theta = 10000.f;
  g.rope_dim = 64;
  return g;
}

}  // namespace host_api_test
