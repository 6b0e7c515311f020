// ProbePolicy: a policy compiled into the plugin-support tests, with one parameter of every kind,
// a validate of its own and a select hook that throws on request; with the values for its schema
// and the geometry the tests create it on. Shared by test_plugin_support.cpp (tables, entry,
// validate, create) and test_plugin_support_hooks.cpp (hooks, params, helpers).
#pragma once

#include <sieve/plugin/policy_api.hpp>

#include <new>
#include <stdexcept>

#include "support/layer_call.hpp"

namespace plugin_support_test {

namespace sp = sieve::plugin;

enum class Throw { none, error, std_exception, bad_alloc, other };

class ProbePolicy final : public sp::PolicyBase {
 public:
  static constexpr int32_t kHeadDims[] = {8, 64};
  static constexpr sieve_param_spec kParams[] = {
      sp::int_param("budget", "8", 1, 64, "pages per row"),
      sp::float_param("tau", "0.5", 0, 1, "threshold"),
      sp::bool_param("pin", "1", "pin the first page"),
      sp::enum_param("metric", "l2", "cosine|l2", "distance"),
      sp::string_param("weights", "", "weights file"),
      sp::int_list_param("layers", "0,1", 0, 31, "layers served"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "probe",
      .vendor = "test",
      .version_major = 0,
      .version_minor = 1,
      .version_patch = 0,
      .summary = "exercises the support library",
      .phases = SIEVE_PHASE_DECODE,
      .devices = SIEVE_DEVICE_CPU,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_BF16,
      .head_dims = kHeadDims,
      .n_head_dims = 2,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_KV_HEAD,
      .needs = 0,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_NONE,
      .conform_params = nullptr,
      .selection_basis = SIEVE_SELECTION_BASIS_UNDECLARED,
      .kv_layouts = 0,  // compact HND only
  };
  static inline int validate_calls = 0;
  static inline Throw select_throws = Throw::none;

  static void validate(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
    ++validate_calls;
    if (p.integer("budget") * g.page_size > g.max_seq_len)
      r.invalid("budget x page_size = ", p.integer("budget") * g.page_size, " exceeds max_seq_len");
  }

  explicit ProbePolicy(const sp::CreateContext& ctx)
      : PolicyBase(ctx), scratch_(allocate(sieve::kCpu, 1024, 64)) {
    if (ctx.params.text("weights") == "missing.bin")
      sp::fail(SIEVE_ERR_NOT_FOUND, "weights file 'missing.bin' not found");
    log_info("created with budget ", ctx.params.integer("budget"));
  }

  void select(const sieve_layer_call&, sieve_selection& selection, uint32_t& stats) override {
    switch (select_throws) {
      case Throw::error: sp::fail(SIEVE_ERR_CAPACITY, "row ", 3, " needs ", 9, " pages");
      case Throw::std_exception: throw std::logic_error("broken invariant");
      case Throw::bad_alloc: throw std::bad_alloc();
      case Throw::other: throw 42;
      case Throw::none: break;
    }
    selection.kind = SIEVE_SEL_BLOCKS;
    stats = SIEVE_STATS_PAGE_MASS_PER_KV_HEAD;
  }
  void end_step(const sieve_step_end&) override {}

 private:
  sp::HostBuffer scratch_;
};

inline const sieve_policy_api& probe_api() { return sp::policy_api_v<ProbePolicy>; }

// Values for ProbePolicy's schema, defaults filled in; tests tweak them.
struct ProbeValues {
  int64_t layers[2] = {0, 1};
  sieve_param_value v[6] = {
      {SIEVE_PARAM_INT, 8, 0, nullptr, nullptr, 0},
      {SIEVE_PARAM_FLOAT, 0, 0.5, nullptr, nullptr, 0},
      {SIEVE_PARAM_BOOL, 1, 0, nullptr, nullptr, 0},
      {SIEVE_PARAM_ENUM, 1, 0, "l2", nullptr, 0},
      {SIEVE_PARAM_STRING, 0, 0, "", nullptr, 0},
      {SIEVE_PARAM_INT_LIST, 0, 0, nullptr, layers, 2},
  };
  uint32_t n = 6;
};

inline sieve_geometry probe_geometry() { return sieve::testing::test_geometry(16, 4, 512); }

}  // namespace plugin_support_test
