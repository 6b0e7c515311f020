// The numeric / device part of `sieve conform`: the plugin's hooks on real tensors, through the
// same runtime path a host uses (KV store, LayerRunner, core kernels), against the f64 reference;
// whether a selecting plugin ever leaves the dense path, and whether it finds planted keys
// (docs/conformance.md); then its error paths with missing arguments. A plugin that crashes here fails the check it was
// in: conform() runs this part in a forked child.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/params.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/workload/synthetic.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/status.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime {

namespace {

struct Config {
  int32_t hq, hkv, d, page;
  std::vector<int32_t> context;
  int32_t new_tokens;
  DLDataType dtype;
};

bool listed(const int32_t* values, uint32_t n, int32_t v) {
  return n == 0 || std::find(values, values + n, v) != values + n;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}

// Context lengths of the numeric checks, in tokens. A selecting plugin's conformance budgets
// (its conform_params) must be several times smaller, so that the long sequence reaches the
// sparse path (docs/conformance.md: budgets of at most 256 tokens).
constexpr int32_t kLongDecode = 1024;   // + 1: a last page of one token
constexpr int32_t kLongPrefill = 512;   // + 5
constexpr int32_t kPrefillQueries = 131;  // new tokens per sequence: two query blocks of 64 and a tail
constexpr int32_t kMaxConformBudget = 256;  // what docs/conformance.md promises reaches the sparse path

// Ragged batches with short sequences AHEAD of the long one (a row written at a fixed per-row
// offset then lands in the wrong place): shorter than a page, a last page of 5, the long one.
std::vector<int32_t> contexts(uint32_t phase, int32_t page) {
  if (phase == SIEVE_PHASE_PREFILL) return {page - 3, 3 * page + 5, kLongPrefill + 5};
  return {page - 3, 2 * page + 5, kLongDecode + 1};
}

// Geometries the plugin declares: at the first page size it lists among 16/32/64, GQA 1/2/4/8 at
// head dims 8/64/128 plus bf16/f16 when declared; then one geometry at each further listed page
// size among 32/64. With a --geometry override: that one geometry (fields not given as
// declared_geometry picks them).
std::vector<Config> configs(const sieve_policy_descriptor& d, uint32_t phase, const GeometryOverride& o) {
  std::vector<int32_t> pages;
  for (int32_t p : {16, 32, 64})
    if (listed(d.page_sizes, d.n_page_sizes, p)) pages.push_back(p);
  if (o.page_size) pages = {o.page_size};
  std::vector<Config> out;
  if (pages.empty()) return out;
  const int32_t page = pages.front();
  const bool prefill = phase == SIEVE_PHASE_PREFILL;
  const int32_t new_tokens = prefill ? kPrefillQueries : 1;
  if (o.any()) {
    const sieve_geometry g = declared_geometry(d, o);
    const int32_t hkv = o.n_kv_heads ? o.n_kv_heads : o.n_q_heads ? (o.n_q_heads % 2 ? 1 : 2) : 2;
    const int32_t hq = o.n_q_heads ? o.n_q_heads : 4 * hkv;
    out.push_back({hq, hkv, g.head_dim, page, contexts(phase, page), new_tokens, g.kv_dtype});
    return out;
  }
  for (int32_t dim : {8, 64, 128}) {
    if (!listed(d.head_dims, d.n_head_dims, dim)) continue;
    for (int32_t group : {1, 2, 4, 8}) {
      // Large head dims with every GQA ratio would only repeat the same code path slowly.
      if (dim == 128 && group != 4) continue;
      out.push_back({2 * group, 2, dim, page, contexts(phase, page), new_tokens, kF32});
    }
  }
  const int32_t dim = listed(d.head_dims, d.n_head_dims, 64) ? 64 : out.empty() ? 0 : out.back().d;
  if (dim == 0) return out;
  if (d.dtypes & SIEVE_DTYPE_BF16) out.push_back({8, 2, dim, page, contexts(phase, page), new_tokens, kBF16});
  if (d.dtypes & SIEVE_DTYPE_F16) out.push_back({8, 2, dim, page, contexts(phase, page), new_tokens, kF16});
  for (size_t i = 1; i < pages.size(); ++i)
    out.push_back({8, 2, dim, pages[i], contexts(phase, pages[i]), new_tokens, kF32});
  return out;
}

// A plugin may decline a parameter combination on one device (validate answers
// SIEVE_ERR_UNSUPPORTED, e.g. a mode implemented on the CPU only): that device's numeric check is
// then skipped with the plugin's own reason, not failed. Returns the reason, or "" when accepted.
std::string declined_on(const LoadedPlugin& plugin, DLDevice device, const ConformOptions& options) {
  const sieve_policy_api& api = *plugin.policy();
  ParamValues values;
  std::vector<std::string> errors;
  if (!api.validate || !parse_params(ParamSchema::of(api), options.params, &values, &errors)) return "";
  sieve_geometry g = declared_geometry(*plugin.descriptor(), options.geometry);
  g.device = device;
  std::string reason;
  sieve_reason_sink sink{&reason, [](void* c, const char* m) {
                           auto& r = *static_cast<std::string*>(c);
                           if (m && *m) r += (r.empty() ? "" : "; ") + std::string(m);
                         }};
  if (api.validate(&g, values.data(), values.size(), sink) != SIEVE_ERR_UNSUPPORTED) return "";
  return reason.empty() ? "validate answered SIEVE_ERR_UNSUPPORTED" : reason;
}

std::string config_name(const Config& c) {
  return "hq " + std::to_string(c.hq) + "/hkv " + std::to_string(c.hkv) + ", d " + std::to_string(c.d) +
         ", page " + std::to_string(c.page) + ", " + dtype_name(c.dtype);
}

// Layers each numeric run goes through in its one step: an instance serving several layers
// (DELTA selects at a Δ-layer and reuses the selection at the next) reaches its sparse layer.
constexpr int32_t kRunLayers = 2;

// The one-instance chain of the plugin over every layer of a phase, with the conformance
// parameters (conform_params and --param; the schema's defaults otherwise).
bool plugin_chain(const LoadedPlugin& plugin, const std::string& phase_name, const ConformOptions& options,
                  ChainSpec* chain, std::string* error) {
  if (!parse_chain_spec(phase_name + ":*=" + plugin.name(), chain, error)) return false;
  chain->instances.at(0).params = options.params;
  chain->instances.at(0).params_given = !options.params.empty();
  return true;
}

SyntheticSpec synthetic_spec(const Config& c, uint32_t phase, DLDevice device, const ConformOptions& options,
                             uint64_t seed) {
  SyntheticSpec s;
  s.phase = phase;
  s.n_q_heads = c.hq;
  s.n_kv_heads = c.hkv;
  s.head_dim = c.d;
  s.page_size = c.page;
  s.n_layers = std::max(kRunLayers, options.geometry.n_layers);
  s.run_layers = kRunLayers;
  s.context = c.context;
  s.new_tokens = c.new_tokens;
  s.kv_dtype = c.dtype;
  s.device = device;
  s.seed = seed;
  s.timing_reps = 1;
  return s;
}

const char* device_word(DLDevice device) { return device.device_type == kDLCUDA ? "cuda" : "cpu"; }

// Where the numeric runs of one device left the dense path (for sparse_path_<device>).
struct SparseEvidence {
  int runs = 0;
  std::string reached;  // "" when no run attended less than every key or evicted anything
};

void numeric_checks(const LoadedPlugin& plugin, const Registry& registry, DLDevice device, uint32_t phase,
                    const ConformOptions& options, ConformReport* report, SparseEvidence* sparse) {
  const sieve_policy_descriptor& desc = *plugin.descriptor();
  const std::string phase_name = phase == SIEVE_PHASE_PREFILL ? "prefill" : "decode";
  const std::string name = "numeric_" + std::string(device_word(device)) + "_" + phase_name;
  const auto cfgs = configs(desc, phase, options.geometry);
  if (cfgs.empty()) {
    report->skip(name, "no declared head dim among 8/64/128 or page size among 16/32/64");
    return;
  }
  if (const std::string why = declined_on(plugin, device, options); !why.empty()) {
    report->skip(name, "the plugin declines these parameters on this device: " + why);
    return;
  }
  ChainSpec chain;
  std::string error;
  if (!plugin_chain(plugin, phase_name, options, &chain, &error)) {
    report->fail(name, "chain for the plugin: " + error);
    return;
  }
  double worst_kernel = 0, worst_dense = 0, min_recall = 1, min_attended = 1;
  uint64_t hook_allocs = 0;
  std::string worst_cfg;
  int runs = 0;
  for (const Config& c : cfgs) {
    if (!(desc.dtypes & dtype_bit(c.dtype))) continue;
    SyntheticReport r;
    if (!run_synthetic(synthetic_spec(c, phase, device, options, 1234 + uint64_t(runs)), chain, registry, &r, &error)) {
      report->fail(name, config_name(c) + ": " + error);
      return;
    }
    ++runs;
    hook_allocs += r.hook_allocations;
    // The output must equal the f64 attention over the selection the plugin made (f32 storage:
    // 1e-4 leaves room for f32 accumulation order; 16-bit storage: 2e-2), unless a hook rewrote it.
    const double tol = same_dtype(c.dtype, kF32) ? 1e-4 : 2e-2;
    if (r.non_finite > 0) {
      report->fail(name, config_name(c) + ": " + std::to_string(r.non_finite) + " non-finite outputs");
      return;
    }
    if (r.kernel_rel_err >= 0 && !(r.kernel_rel_err <= tol)) {
      report->fail(name, config_name(c) + ": output differs from the f64 attention over the plugin's own selection: rel err " +
                             fmt(r.kernel_rel_err) + " > " + fmt(tol));
      return;
    }
    if (r.kernel_rel_err > worst_kernel) worst_kernel = r.kernel_rel_err, worst_cfg = config_name(c);
    worst_dense = std::max(worst_dense, r.rel_err);
    min_recall = std::min(min_recall, r.recall);
    min_attended = std::min(min_attended, r.attended_fraction);
    if (sparse->reached.empty() && (r.attended_fraction < 1 || r.evicted_bytes > 0))
      sparse->reached = phase_name + " " + config_name(c) + ": " +
                        (r.evicted_bytes > 0 ? std::to_string(r.evicted_bytes) + " KV bytes evicted"
                                             : "attended " + fmt(r.attended_fraction) + " of the causal keys");
  }
  if (runs == 0) {
    report->skip(name, "no declared dtype among f32/bf16/f16");
    return;
  }
  sparse->runs += runs;
  report->pass(name, std::to_string(runs) + " geometries; worst rel err vs f64 over its selection " + fmt(worst_kernel) +
                         (worst_cfg.empty() ? "" : " (" + worst_cfg + ")") + "; vs dense " + fmt(worst_dense) +
                         ", min recall " + fmt(min_recall) + ", min attended fraction " + fmt(min_attended));
  const std::string alloc_name = "no_hot_path_allocation_" + std::string(device_word(device)) + "_" + phase_name;
  if (hook_allocs == 0)
    report->pass(alloc_name, "hooks made no allocation through the services table");
  else
    report->fail(alloc_name, std::to_string(hook_allocs) + " allocations through the services table inside hooks");
}

// A plugin that declares it selects (CONTENT or POSITIONAL) must leave the dense path somewhere
// in the numeric runs: budgets at their defaults (1024 tokens and more) never do at these lengths.
void sparse_path_check(const sieve_policy_descriptor& desc, DLDevice device, const SparseEvidence& sparse,
                       ConformReport* report) {
  const std::string name = "sparse_path_" + std::string(device_word(device));
  const uint32_t basis = declared_selection_basis(desc);
  if (sparse.runs == 0) return report->skip(name, "no numeric run on this device");
  if (basis == SIEVE_SELECTION_BASIS_NONE)
    return report->skip(name, "selection_basis NONE: the plugin never narrows the selection");
  if (!sparse.reached.empty()) return report->pass(name, sparse.reached);
  const std::string why = "every run attended every causal key and evicted nothing (" + std::to_string(sparse.runs) +
                          " runs, contexts up to " + std::to_string(kLongDecode + 1) +
                          " tokens): the sparse path was never reached; declare conform_params with budgets of at most " +
                          std::to_string(kMaxConformBudget) + " tokens";
  if (basis == SIEVE_SELECTION_BASIS_UNDECLARED)
    return report->skip(name, "warning (selection_basis undeclared, an ABI 1.0 plugin): " + why);
  report->fail(name, why);
}

// The planted probe (reference/planted.hpp) in every phase the plugin declares: CONTENT plugins
// must attend (and keep resident) at least kMinPlantedRecall of the planted mass. A selection that
// finds every planted key scores 1 exactly; 0.9 tolerates one planted key missed in ten. One key
// per (sequence, KV head), so any budget with one page besides the forced last one can hold it.
constexpr double kMinPlantedRecall = 0.9;
constexpr int32_t kPlantedPerHead = 1;

void planted_check(const LoadedPlugin& plugin, const Registry& registry, DLDevice device,
                   const ConformOptions& options, ConformReport* report) {
  const sieve_policy_descriptor& desc = *plugin.descriptor();
  const std::string name = "planted_recall_" + std::string(device_word(device));
  const uint32_t basis = declared_selection_basis(desc);
  if (basis == SIEVE_SELECTION_BASIS_NONE)
    return report->skip(name, "selection_basis NONE: the plugin never narrows the selection");
  if (!declined_on(plugin, device, options).empty())
    return report->skip(name, "the plugin declines these parameters on this device");
  std::string detail, error;
  double worst = 2;
  for (uint32_t phase : {uint32_t(SIEVE_PHASE_DECODE), uint32_t(SIEVE_PHASE_PREFILL)}) {
    if (!(desc.phases & phase)) continue;
    const auto cfgs = configs(desc, phase, options.geometry);
    if (cfgs.empty()) continue;
    // Four KV heads, so a page read with the wrong head or token stride lands on other keys.
    Config c = cfgs.front();
    if (!options.geometry.any()) {
      c.hq = 8, c.hkv = 4;
      if (listed(desc.head_dims, desc.n_head_dims, 64)) c.d = 64;
    }
    c.dtype = (desc.dtypes & SIEVE_DTYPE_F32) ? kF32 : (desc.dtypes & SIEVE_DTYPE_BF16) ? kBF16 : kF16;
    const std::string phase_name = phase == SIEVE_PHASE_PREFILL ? "prefill" : "decode";
    ChainSpec chain;
    SyntheticReport r;
    SyntheticSpec s = synthetic_spec(c, phase, device, options, 4321);
    s.planted_keys = kPlantedPerHead;
    if (!plugin_chain(plugin, phase_name, options, &chain, &error) || !run_synthetic(s, chain, registry, &r, &error))
      return report->fail(name, phase_name + " " + config_name(c) + ": " + error);
    detail += (detail.empty() ? "" : "; ") + phase_name + " " + fmt(r.planted_recall) +
              (r.attended_fraction < 1 || r.evicted_bytes > 0 ? "" : " (dense: every key attended)");
    if (r.planted_recall >= 0) worst = std::min(worst, r.planted_recall);
  }
  if (worst > 1) return report->skip(name, "no phase ran the probe (no declared geometry)");
  detail = "recall of planted mass " + detail + " (selection_basis " + selection_basis_name(basis) + ")";
  if (worst >= kMinPlantedRecall) return report->pass(name, detail);
  if (basis == SIEVE_SELECTION_BASIS_POSITIONAL)
    return report->pass(name, "content-blind by design, not required: " + detail);
  const std::string why = detail + ": below " + fmt(kMinPlantedRecall) +
                          ", the selection misses keys aligned with the queries (K read with the wrong layout, head "
                          "or page?)";
  if (basis == SIEVE_SELECTION_BASIS_CONTENT) return report->fail(name, why);
  report->pass(name, "warning (selection_basis undeclared, an ABI 1.0 plugin): " + why);
}

// Hooks called with missing arguments must answer with a status (the child process survives).
void error_path_checks(const LoadedPlugin& plugin, const ConformOptions& options, ConformReport* report) {
  const sieve_policy_api& api = *plugin.policy();
  ParamValues values;
  std::vector<std::string> errors;
  if (!parse_params(ParamSchema::of(api), options.params, &values, &errors)) {
    report->fail("hooks_reject_null_arguments", "parameters do not parse: " + (errors.empty() ? "" : errors[0]));
    return;
  }
  const sieve_geometry g = declared_geometry(*plugin.descriptor(), options.geometry);
  if (g.device.device_type == kDLCUDA && cuda_devices() == 0) {
    report->skip("hooks_reject_null_arguments", "the plugin runs on CUDA only and this machine has no usable CUDA device");
    return;
  }
  HostServices services(g.device);
  sieve_policy* p = nullptr;
  std::string reason;
  sieve_reason_sink sink{&reason, [](void* c, const char* m) { *static_cast<std::string*>(c) = m ? m : ""; }};
  // No KV store: a policy that needs one must say so with a status, not crash.
  sieve_status st = api.create(services.table(), &g, values.data(), values.size(), nullptr, nullptr, &p, sink);
  if (st != SIEVE_OK || !p) {
    report->skip("hooks_reject_null_arguments", "create without a KV store answered " + status_name(st) +
                                                    (reason.empty() ? "" : ": " + reason) + " (a status, as required)");
    return;
  }
  std::vector<std::string> bad;
  uint32_t stats = 0;
  if (api.on_append && api.on_append(p, nullptr, nullptr) == SIEVE_OK) bad.push_back("on_append(NULL call)");
  if (api.select && api.select(p, nullptr, nullptr, &stats) == SIEVE_OK) bad.push_back("select(NULL call, NULL selection)");
  if (api.attend && api.attend(p, nullptr, nullptr, nullptr) == SIEVE_OK) bad.push_back("attend(NULL call, NULL out)");
  if (api.observe && api.observe(p, nullptr, nullptr) == SIEVE_OK) bad.push_back("observe(NULL call, NULL stats)");
  if (api.correct && api.correct(p, nullptr, nullptr, nullptr) == SIEVE_OK) bad.push_back("correct(NULL call, NULL out)");
  if (api.end_step && api.end_step(p, nullptr) == SIEVE_OK) bad.push_back("end_step(NULL step)");
  const char* last = api.last_error ? api.last_error(p) : nullptr;
  const std::string msg = last ? last : "";  // copied: the instance owns the text
  const bool has_message = !msg.empty();
  api.destroy(p);
  if (!bad.empty()) {
    std::string all;
    for (const auto& b : bad) all += (all.empty() ? "" : ", ") + b;
    report->fail("hooks_reject_null_arguments", "returned SIEVE_OK for " + all);
  } else if (!has_message) {
    report->fail("hooks_reject_null_arguments", "statuses returned, but last_error() gives no message");
  } else {
    report->pass("hooks_reject_null_arguments", "every hook answered a status; last message: " + msg);
  }
}

}  // namespace

void conform_numeric(const LoadedPlugin& plugin, ConformReport* report, const ConformOptions& options) {
  const sieve_policy_descriptor* desc = plugin.descriptor();
  if (!plugin.policy() || !desc) {
    report->skip("numeric", "the plugin ships no policy");
    return;
  }
  Registry registry;
  if (!registry.add_file(plugin.path)) {
    report->fail("numeric", "reloading " + plugin.path + " failed");
    return;
  }
  // Every check creates the plugin with its conformance parameters (conform_params, --param).
  ConformOptions conform_options = options;
  std::string error;
  if (!conform_param_pairs(*desc, options.params, &conform_options.params, &error)) {
    report->fail("numeric", error);
    return;
  }
  std::vector<DLDevice> devices;
  if (desc->devices & SIEVE_DEVICE_CPU) devices.push_back(kCpu);
  if (desc->devices & SIEVE_DEVICE_CUDA) {
    if (cuda_devices() > 0)
      devices.push_back(DLDevice{kDLCUDA, 0});
    else
      report->skip("numeric_cuda", "the plugin declares CUDA but this machine has no usable CUDA device");
  }
  for (DLDevice dev : devices) {
    SparseEvidence sparse;
    for (uint32_t phase : {uint32_t(SIEVE_PHASE_DECODE), uint32_t(SIEVE_PHASE_PREFILL)})
      if (desc->phases & phase) numeric_checks(plugin, registry, dev, phase, conform_options, report, &sparse);
    sparse_path_check(*desc, dev, sparse, report);
    planted_check(plugin, registry, dev, conform_options, report);
  }
  error_path_checks(plugin, conform_options, report);
}

}  // namespace sieve::runtime
