// ABI conformance of a plugin binary (what `sieve conform PLUGIN.so` and CI run).
//
// Static part (conformance_static.cpp; no GPU, no KV store): the file, the entry symbol, major
// negotiation (the host's major, a newer one, 0), every table's size and version, the
// descriptor, the parameter schema, validate() on a plausible and on impossible geometries, and
// create() with a wrong-length value array and with an impossible geometry.
// Numeric part (conformance_numeric.cpp): hooks run on real tensors against the dense f64
// reference (the synthetic workload, core/workload), and error paths with bad tensors.
// KV-store suite (conformance_store*.cpp): a store table's append/view round trips against an f64
// reference, page tables, sidecars, eviction, removal and refusals, on every store.
// Library: sieve_conformance (core/runtime/CMakeLists.txt), not part of sieve_runtime.
//
// Isolation: each part runs in a forked child process by default, so a plugin that crashes or
// hangs fails the check it was in ("crashed with SIGSEGV during <check>") instead of taking the
// conformance run down with it.
#pragma once

#include <string>
#include <vector>

#include "sieve/runtime/loader.hpp"
#include "sieve/runtime/params.hpp"
#include "sieve/runtime/registry.hpp"

namespace sieve::runtime {

struct ConformCheck {
  std::string name;
  bool passed = false;
  bool skipped = false;
  std::string detail;
  std::string store;  // the KV store a store-suite check ran on ("" for plugin checks)
};

struct ConformReport {
  std::string plugin_path;
  std::vector<ConformCheck> checks;

  // No check failed and at least one ran.
  bool passed() const;
  const ConformCheck* find(const std::string& name) const;
  void pass(const std::string& name, const std::string& detail = "");
  void fail(const std::string& name, const std::string& detail);
  void skip(const std::string& name, const std::string& detail);
};

// Geometry fields that replace those conformance would pick from the descriptor (0 / bits 0:
// not given). `sieve conform --geometry hq=8,hkv=4,d=8,page=16,dtype=f32,layers=5`.
struct GeometryOverride {
  int32_t n_q_heads = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
  DLDataType kv_dtype{0, 0, 0};
  int32_t n_layers = 0;  // the model's layer count (static: 4; numeric: 2); numeric runs layers 0, 1
  bool any() const { return n_q_heads || n_kv_heads || head_dim || page_size || kv_dtype.bits; }
};

// "hq=8,hkv=4,d=8,page=16,dtype=bf16,layers=5" (any subset, any order); false with one line in
// *error.
bool parse_geometry_override(const std::string& text, GeometryOverride* out, std::string* error);

struct ConformOptions {
  bool isolate = true;   // run plugin code in a forked child (see above). Fork from a process
                         // that has not started OpenMP threads (libgomp is not fork-safe).
  int timeout_s = 120;   // per part, in the child; then the child is killed and the check fails
  // The plugin's parameters for every check that validates or creates it (`--param k=v`);
  // parameters not named keep their schema defaults. Empty: defaults only.
  ParamPairs params;
  // Replaces fields of the declared geometry in the static checks and makes the numeric part run
  // that one geometry (with its usual ragged contexts) instead of its sweep.
  GeometryOverride geometry;
};

// ABI 1.1 descriptor fields, read only when the plugin's descriptor has them: the parameter text
// it declares for conformance ("" when none) and its sieve_selection_basis (UNDECLARED for 1.0).
const char* declared_conform_params(const sieve_policy_descriptor& d);
uint32_t declared_selection_basis(const sieve_policy_descriptor& d);
// "content", "positional", "none", "undeclared".
const char* selection_basis_name(uint32_t basis);

// The parameters every check validates and creates the plugin with: the descriptor's
// conform_params (a chain item's parameter syntax), each replaced by a `--param` of the same name,
// plus the other `--param`s. False with one line in *error when conform_params do not parse.
bool conform_param_pairs(const sieve_policy_descriptor& d, const ParamPairs& given, ParamPairs* out,
                         std::string* error);

// The static checks. Check names (stable; tests and CI refer to them):
//   file, entry_symbol, score, negotiate_host_major, negotiate_newer_host, negotiate_major_0,
//   plugin_table, policy_table, descriptor, schema, conform_params, kv_store_table,
//   validate_accepts_declared, validate_rejects_head_dim_0, validate_rejects_gqa_mismatch,
//   validate_rejects_page_size_0, validate_rejects_unlisted_head_dim,
//   validate_rejects_unlisted_page_size, validate_rejects_unsupported_dtype,
//   validate_rejects_unsupported_device, create_rejects_missing_values,
//   create_rejects_head_dim_0
ConformReport conform_static(const std::string& path, const ConformOptions& options = {});

// A plausible geometry the descriptor declares it supports (a listed head dim and page size,
// preferring 128 and 16; a declared dtype and device, CPU first): what conformance sets up.
sieve_geometry declared_geometry(const sieve_policy_descriptor& descriptor);
// declared_geometry with the fields of `geometry` that are set.
sieve_geometry declared_geometry(const sieve_policy_descriptor& descriptor, const GeometryOverride& geometry);

// True when the static checks the numeric part relies on (file through descriptor and schema)
// all passed, so the plugin can be loaded and its hooks called.
bool static_gate_passed(const ConformReport& report);

// The numeric / device part, appended to `report` (conformance_numeric.cpp).
void conform_numeric(const LoadedPlugin& plugin, ConformReport* report, const ConformOptions& options = {});

// conform_static, then (if static_gate_passed) load the plugin and conform_numeric, and the
// KV-store suite on the store the plugin ships (if any).
ConformReport conform(const std::string& path, const ConformOptions& options = {});

// ---- The KV-store suite (conformance_store*.cpp; docs/conformance.md, "KV stores") ----------

struct StoreUnderTest {
  std::string name;    // what `--store NAME` matches; every check of the store carries it
  std::string origin;  // "built-in", or the plugin file that ships it
  const sieve_kv_store_api* api = nullptr;
  // Where a table without a descriptor (ABI 1.0) runs; a descriptor's `devices` replaces it.
  uint32_t devices_1_0 = SIEVE_DEVICE_CPU;
};

// The one place that lists the stores `sieve conform` checks with no arguments: the registry's
// stores (the core's, then every plugin's; `registry` must outlive the returned tables).
std::vector<StoreUnderTest> known_stores(const Registry& registry);
StoreUnderTest store_under_test(const StoreEntry& entry);

// The suite on one store: its table, then every device it declares, each part in a forked child
// (a crash or hang fails the check that was running); checks are appended to `report`, each
// with `store` = store.name. CUDA checks skip (with the reason) on a machine without a device.
void conform_store(const StoreUnderTest& store, const ConformOptions& options, ConformReport* report);

// The store suite's check names, in the order they run ("<check>_cpu", "<check>_cuda" per device).
const std::vector<std::string>& store_check_names();

}  // namespace sieve::runtime
