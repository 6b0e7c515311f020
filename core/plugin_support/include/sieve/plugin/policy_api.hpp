// Sieve plugin support: write a policy as a C++ class; get the C table, the entry point and
// exception-safe trampolines generated. Nothing C++ crosses the boundary: the host sees only the
// C structs of api/sieve/*.h. (Writing against those C headers alone is equally supported; this
// library is a convenience, linked statically into the plugin, never a second contract.)
//
// ---- How to write a policy ------------------------------------------------------------------
//
//   #include <sieve/plugin/policy_api.hpp>
//   namespace sp = sieve::plugin;
//
//   class Recent final : public sp::PolicyBase {
//    public:
//     static constexpr sieve_param_spec kParams[] = {             // optional: no kParams, no params
//         sp::int_param("pages", "8", 1, 1 << 20, "most recent pages each row attends")};
//     static constexpr sieve_policy_descriptor kDescriptor = {     // required, constexpr
//         .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor), .name = "recent", .vendor = "acme",
//         .version_major = 1, .version_minor = 0, .version_patch = 0,
//         .summary = "the last N pages", .phases = SIEVE_PHASE_DECODE,
//         .devices = SIEVE_DEVICE_CPU, .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16,
//         .head_dims = nullptr, .n_head_dims = 0, .page_sizes = nullptr, .n_page_sizes = 0,
//         .selection_heads = SIEVE_SEL_PER_SEQUENCE, .needs = 0, .evicts_kv = 0,
//         .cuda_graph = SIEVE_CUDA_GRAPH_NONE,
//         .conform_params = "pages=4",              // ABI 1.1: what `sieve conform` runs
//         .selection_basis = SIEVE_SELECTION_BASIS_POSITIONAL};  // (every field: -Wextra flags omitted ones)
//     static constexpr sieve_tool kTools[] = {                    // optional (tool.hpp): its tools
//         sp::tool<calibrate_main>("calibrate", "per-head budgets from a model's prefill")};
//
//     // optional: extra reasons beyond the generic checks (geometry vs descriptor, values vs
//     // schema); runs only when those passed
//     static void validate(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
//       if (p.integer("pages") * g.page_size > g.max_seq_len) r.invalid("pages exceed max_seq_len");
//     }
//     // required: create. Allocate scratch here (allocate()), register sidecars on ctx.kv.
//     explicit Recent(const sp::CreateContext& ctx)
//         : PolicyBase(ctx), pages_(ctx.params.integer("pages")) {}
//
//     // override only the hooks the policy uses; the others are NULL in the C table
//     void select(const sieve_layer_call& call, sieve_selection& sel, uint32_t& stats) override {
//       ...;  if (bad) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "row ", r, " has ", n, " pages");
//     }
//    private:
//     int64_t pages_;
//   };
//   SIEVE_DEFINE_PLUGIN(Recent);  // defines the exported sieve_plugin_entry
//
// Build it with `sieve_add_plugin(NAME recent SOURCES recent.cpp)` in tree; out of tree, after
// find_package(Sieve), `target_link_libraries(recent PRIVATE Sieve::plugin_support)` and
// `sieve_plugin_properties(recent NAME recent)` (docs/plugin-authoring.md §11).
//
// What the generated table does:
//  - every C entry is noexcept: an Error keeps its status, std::bad_alloc becomes OUT_OF_MEMORY,
//    anything else INTERNAL; the message goes to last_error ("select: ...") or the reason/err sink;
//  - a hook the class does not override is NULL, so hook presence is declared by the code itself;
//    an instance that needs fewer of them (a mode that only selects) says so in its constructor
//    with use_hooks(), answered through instance_hooks (ABI 1.1); naming a hook the class does
//    not override fails create;
//    a descriptor that needs page stats without an observe hook, or evicts without end_step, fails
//    to compile;
//  - validate and create check the structs' sizes, the geometry against the descriptor and the
//    values against the schema (create re-runs validate, so an instance never sees bad input);
//  - hooks get references, never NULL: a NULL call/selection/stats pointer is INVALID_ARGUMENT;
//  - the entry point answers major 1 to any host major >= 1, and SIEVE_ERR_VERSION (with
//    *plugin_major = 1, *table = NULL) to a host that speaks only major 0.
#pragma once
#include <sieve/sieve.h>

#include <iterator>
#include <memory>
#include <string>
#include <type_traits>

#include "sieve/plugin/checks.hpp"
#include "sieve/plugin/error.hpp"
#include "sieve/plugin/params.hpp"
#include "sieve/plugin/policy_base.hpp"
#include "sieve/plugin/reasons.hpp"
#include "sieve/plugin/tool.hpp"

namespace sieve::plugin {

// The entry-point negotiation for any plugin table (a policy, a KV store or both): writes
// mine->abi_major to *plugin_major always; hands out `mine` when the host speaks that major or a
// newer one, else SIEVE_ERR_VERSION with *table = NULL. NULL out-pointers: INVALID_ARGUMENT.
sieve_status negotiate_entry(uint32_t host_major, uint32_t* plugin_major,
                             const sieve_plugin** table, const sieve_plugin* mine) noexcept;

namespace detail {

// Throws when `used` (an instance's use_hooks()) names a hook outside `overridden`.
void check_instance_hooks(uint32_t used, uint32_t overridden);

template <class D>
constexpr const sieve_param_spec* params_of() {
  if constexpr (requires { D::kParams; }) return std::data(D::kParams);
  else return nullptr;
}
template <class D>
constexpr uint32_t n_params_of() {
  if constexpr (requires { D::kParams; }) return uint32_t(std::size(D::kParams));
  else return 0;
}
template <class D>
constexpr const sieve_tool* tools_of() {
  if constexpr (requires { D::kTools; }) return std::data(D::kTools);
  else return nullptr;
}
template <class D>
constexpr uint32_t n_tools_of() {
  if constexpr (requires { D::kTools; }) return uint32_t(std::size(D::kTools));
  else return 0;
}

// A hook is implemented when D (or a class between D and PolicyBase) declares it: the type of
// &D::hook then names that class instead of PolicyBase.
#define SIEVE_PLUGIN_OVERRIDES(D, hook) \
  (!std::is_same_v<decltype(&D::hook), decltype(&::sieve::plugin::PolicyBase::hook)>)

// The sieve_hook_bits of the hooks D overrides: the non-NULL hooks of its C table.
template <class D>
constexpr uint32_t overridden_hooks() {
  return (SIEVE_PLUGIN_OVERRIDES(D, on_append) ? uint32_t(SIEVE_HOOK_ON_APPEND) : 0u) |
         (SIEVE_PLUGIN_OVERRIDES(D, select) ? uint32_t(SIEVE_HOOK_SELECT) : 0u) |
         (SIEVE_PLUGIN_OVERRIDES(D, attend) ? uint32_t(SIEVE_HOOK_ATTEND) : 0u) |
         (SIEVE_PLUGIN_OVERRIDES(D, observe) ? uint32_t(SIEVE_HOOK_OBSERVE) : 0u) |
         (SIEVE_PLUGIN_OVERRIDES(D, correct) ? uint32_t(SIEVE_HOOK_CORRECT) : 0u) |
         (SIEVE_PLUGIN_OVERRIDES(D, end_step) ? uint32_t(SIEVE_HOOK_END_STEP) : 0u);
}

template <class D>
struct Trampolines {
  static PolicyBase* base(sieve_policy* p) noexcept { return reinterpret_cast<PolicyBase*>(p); }
  static const PolicyBase* base(const sieve_policy* p) noexcept {
    return reinterpret_cast<const PolicyBase*>(p);
  }

  // Run a hook body; turn whatever it throws into a status and the instance's last_error.
  template <class F>
  static sieve_status guard(sieve_policy* p, const char* hook, F&& body) noexcept {
    if (!p) return SIEVE_ERR_INVALID_ARGUMENT;
    try {
      body();
      return SIEVE_OK;
    } catch (...) {
      std::string message;
      const sieve_status status = current_exception_status(message);
      base(p)->set_last_error(hook, message);
      return status;
    }
  }

  static void validate_into(const sieve_geometry* g, const sieve_param_value* values,
                            uint32_t n_values, Reasons& reasons) {
    try {
      require_struct(g, "geometry");
    } catch (const Error& e) {
      reasons.add(e.status(), e.what());
      return;
    }
    check_geometry(D::kDescriptor, *g, reasons);
    Params::check(params_of<D>(), n_params_of<D>(), values, n_values, reasons);
    if constexpr (requires(const sieve_geometry& gg, const Params& pp, Reasons& rr) {
                    D::validate(gg, pp, rr);
                  }) {
      if (reasons.empty())
        D::validate(*g, Params(params_of<D>(), n_params_of<D>(), values, n_values), reasons);
    }
  }

  static sieve_status validate(const sieve_geometry* g, const sieve_param_value* values,
                               uint32_t n_values, sieve_reason_sink sink) noexcept {
    try {
      Reasons reasons(sink);
      validate_into(g, values, n_values, reasons);
      return reasons.status();
    } catch (...) {
      std::string message;
      const sieve_status status = current_exception_status(message);
      emit(sink, message.c_str());
      return status;
    }
  }

  static sieve_status create(const sieve_host_services* services, const sieve_geometry* g,
                             const sieve_param_value* values, uint32_t n_values,
                             sieve_kv_store* kv, const sieve_kv_store_api* kv_api,
                             sieve_policy** out, sieve_reason_sink err) noexcept {
    if (out) *out = nullptr;
    try {
      if (!out) fail(SIEVE_ERR_INVALID_ARGUMENT, "out is NULL");
      require_struct(services, "host services");
      Reasons reasons;
      validate_into(g, values, n_values, reasons);
      if (!reasons.empty()) throw Error(reasons.status(), reasons.joined());
      const CreateContext ctx{services, g,  Params(params_of<D>(), n_params_of<D>(), values, n_values),
                              kv,       kv_api, D::kDescriptor.name};
      std::unique_ptr<PolicyBase> instance = std::make_unique<D>(ctx);
      check_instance_hooks(instance->instance_hooks(overridden_hooks<D>()), overridden_hooks<D>());
      *out = reinterpret_cast<sieve_policy*>(instance.release());
      return SIEVE_OK;
    } catch (...) {
      std::string message;
      const sieve_status status = current_exception_status(message);
      emit(err, ("create: " + message).c_str());
      return status;
    }
  }

  static void destroy(sieve_policy* p) noexcept { delete base(p); }

  static uint32_t instance_hooks(const sieve_policy* p) noexcept {
    return p ? base(p)->instance_hooks(overridden_hooks<D>()) : overridden_hooks<D>();
  }

  static const char* last_error(const sieve_policy* p) noexcept {
    return p ? base(p)->last_error() : "last_error: policy is NULL";
  }

  static sieve_status on_append(sieve_policy* p, const sieve_layer_call* call,
                                const sieve_kv_append* a) noexcept {
    return guard(p, "on_append", [&] {
      require_struct(call, "layer call");
      require_struct(a, "append");
      base(p)->on_append(*call, *a);
    });
  }
  static sieve_status select(sieve_policy* p, const sieve_layer_call* call,
                             sieve_selection* selection, uint32_t* stats) noexcept {
    return guard(p, "select", [&] {
      require_struct(call, "layer call");
      require_struct(selection, "selection");
      if (!stats) fail(SIEVE_ERR_INVALID_ARGUMENT, "stats is NULL");
      base(p)->select(*call, *selection, *stats);
    });
  }
  static sieve_status attend(sieve_policy* p, const sieve_layer_call* call,
                             const sieve_selection* selection, DLTensor* out) noexcept {
    return guard(p, "attend", [&] {
      require_struct(call, "layer call");
      require_struct(selection, "selection");
      if (!out) fail(SIEVE_ERR_INVALID_ARGUMENT, "out is NULL");
      base(p)->attend(*call, *selection, *out);
    });
  }
  static sieve_status observe(sieve_policy* p, const sieve_layer_call* call,
                              const sieve_attention_stats* stats) noexcept {
    return guard(p, "observe", [&] {
      require_struct(call, "layer call");
      require_struct(stats, "attention stats");
      base(p)->observe(*call, *stats);
    });
  }
  static sieve_status correct(sieve_policy* p, const sieve_layer_call* call,
                              const sieve_selection* selection, DLTensor* out) noexcept {
    return guard(p, "correct", [&] {
      require_struct(call, "layer call");
      require_struct(selection, "selection");
      if (!out) fail(SIEVE_ERR_INVALID_ARGUMENT, "out is NULL");
      base(p)->correct(*call, *selection, *out);
    });
  }
  static sieve_status end_step(sieve_policy* p, const sieve_step_end* step) noexcept {
    return guard(p, "end_step", [&] {
      require_struct(step, "step end");
      base(p)->end_step(*step);
    });
  }
};

}  // namespace detail

template <class D>
constexpr sieve_policy_api make_policy_api() {
  static_assert(std::is_base_of_v<PolicyBase, D>, "a policy derives from sieve::plugin::PolicyBase");
  static_assert(std::is_constructible_v<D, const CreateContext&>,
                "a policy is constructible from const sieve::plugin::CreateContext&");
  static_assert(std::is_same_v<std::remove_cv_t<decltype(D::kDescriptor)>, sieve_policy_descriptor>,
                "a policy declares static constexpr sieve_policy_descriptor kDescriptor");
  static_assert(!(D::kDescriptor.needs & SIEVE_NEEDS_PAGE_STATS) || SIEVE_PLUGIN_OVERRIDES(D, observe),
                "the descriptor needs page statistics but the policy has no observe hook");
  static_assert(!D::kDescriptor.evicts_kv || SIEVE_PLUGIN_OVERRIDES(D, end_step),
                "the descriptor evicts KV but the policy has no end_step hook");
  using T = detail::Trampolines<D>;
  sieve_policy_api api{};
  api.hdr = SIEVE_HEADER_INIT(sieve_policy_api);
  api.descriptor = &D::kDescriptor;
  api.params = detail::params_of<D>();
  api.n_params = detail::n_params_of<D>();
  api.validate = &T::validate;
  api.create = &T::create;
  api.destroy = &T::destroy;
  api.last_error = &T::last_error;
  api.on_append = SIEVE_PLUGIN_OVERRIDES(D, on_append) ? &T::on_append : nullptr;
  api.select = SIEVE_PLUGIN_OVERRIDES(D, select) ? &T::select : nullptr;
  api.attend = SIEVE_PLUGIN_OVERRIDES(D, attend) ? &T::attend : nullptr;
  api.observe = SIEVE_PLUGIN_OVERRIDES(D, observe) ? &T::observe : nullptr;
  api.correct = SIEVE_PLUGIN_OVERRIDES(D, correct) ? &T::correct : nullptr;
  api.end_step = SIEVE_PLUGIN_OVERRIDES(D, end_step) ? &T::end_step : nullptr;
  api.instance_hooks = &T::instance_hooks;
  return api;
}

// The policy table and the plugin table of a policy class (static storage, never freed).
template <class D>
inline constexpr sieve_policy_api policy_api_v = make_policy_api<D>();
// Its tools are the class's kTools (tool.hpp), when it declares them.
template <class D>
inline constexpr sieve_plugin plugin_table_v = {SIEVE_HEADER_INIT(sieve_plugin), SIEVE_ABI_MAJOR,
                                                D::kDescriptor.name, &policy_api_v<D>, nullptr,
                                                detail::tools_of<D>(), detail::n_tools_of<D>()};

}  // namespace sieve::plugin

// Define the plugin's exported entry point for policy class `PolicyClass` (once per plugin, at
// global scope).
#define SIEVE_DEFINE_PLUGIN(PolicyClass)                                                         \
  extern "C" SIEVE_EXPORT sieve_status sieve_plugin_entry(                                       \
      uint32_t host_major, uint32_t* plugin_major, const sieve_plugin** table) {                 \
    return ::sieve::plugin::negotiate_entry(host_major, plugin_major, table,                     \
                                            &::sieve::plugin::plugin_table_v<PolicyClass>);      \
  }                                                                                              \
  static_assert(std::is_same_v<decltype(&sieve_plugin_entry), sieve_plugin_entry_fn>,            \
                "sieve_plugin_entry must match sieve_plugin_entry_fn")
