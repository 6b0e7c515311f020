// Static ABI conformance (see conformance.hpp): the plugin file, its entry point, major
// negotiation, tables, descriptor and schema, validate() and create() on good and bad input.
#include <algorithm>
#include <map>

#include "conformance_isolation.hpp"
#include "conformance_mock_host.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/descriptor_names.hpp"
#include "sieve/runtime/params.hpp"
#include "sieve/util/abi_v1_0.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/status.hpp"

namespace sieve::runtime {

namespace {

std::string geometry_text(const sieve_geometry& g) {
  const uint32_t bit = dtype_bit(g.kv_dtype);
  return "head_dim " + std::to_string(g.head_dim) + ", page " + std::to_string(g.page_size) +
         ", " + std::to_string(g.n_q_heads) + "q/" + std::to_string(g.n_kv_heads) + "kv heads, " +
         dtype_names(bit) + ", " + (g.device.device_type == kDLCUDA ? "cuda" : "cpu");
}

int32_t unlisted(const int32_t* v, uint32_t n, std::initializer_list<int32_t> candidates) {
  for (int32_t c : candidates)
    if (std::find(v, v + n, c) == v + n) return c;
  return 0;
}

const std::vector<std::string>& static_check_names() {
  static const std::vector<std::string> names = {
      "file", "entry_symbol", "score", "negotiate_host_major", "negotiate_newer_host",
      "negotiate_major_0", "plugin_table", "policy_table", "descriptor", "schema",
      "conform_params", "kv_store_table", "validate_accepts_declared", "validate_rejects_head_dim_0",
      "validate_rejects_gqa_mismatch", "validate_rejects_page_size_0",
      "validate_rejects_unlisted_head_dim", "validate_rejects_unlisted_page_size",
      "validate_rejects_unsupported_dtype", "validate_rejects_unsupported_device",
      "create_rejects_missing_values", "create_rejects_head_dim_0"};
  return names;
}

class StaticChecks {
 public:
  StaticChecks(const std::string& path, CheckSink& s, const ConformOptions& options)
      : path_(path), s_(s), options_(options) {}

  void run() {
    std::string why = check_elf_file(path_);
    if (!why.empty()) {
      fail("file", why);
      return skip_rest("the file is not a loadable ELF shared object");
    }
    pass("file", "ELF shared object for this machine");

    s_.begin("entry_symbol");  // dlopen runs the plugin's static constructors
    std::string err;
    if (!open_plugin_library(path_, &lib_, &err)) {
      fail("entry_symbol", err);
      return skip_rest("the library did not load or has no entry point");
    }
    pass("entry_symbol", SIEVE_PLUGIN_ENTRY_SYMBOL " found");

    if (lib_.score) {
      s_.begin("score");
      int32_t sc = lib_.score();
      pass("score", "score " + std::to_string(sc) +
                           (sc < 0 ? " (unusable on this machine)" : ""));
    } else {
      skip("score", SIEVE_PLUGIN_SCORE_SYMBOL " not exported (optional)");
    }

    if (!negotiate()) return skip_rest("negotiation with the host's major failed");
    if (!tables()) return;
    if (!table_->policy) return;
    validate_checks();
    create_checks();
  }

 private:
  // Every check after the first failure that makes the rest meaningless.
  void skip_rest(const std::string& why) {
    for (const auto& n : static_check_names())
      if (n != "file" && !done_.count(n)) skip(n, why);
  }
  void mark(const std::string& name) { done_[name] = true; }
  void pass(const std::string& n, const std::string& d = "") { mark(n); s_.pass(n, d); }
  void fail(const std::string& n, const std::string& d) { mark(n); s_.fail(n, d); }
  void skip(const std::string& n, const std::string& d) { mark(n); s_.skip(n, d); }

  bool negotiate() {
    mark("entry_symbol");
    mark("score");
    const uint32_t host = SIEVE_ABI_MAJOR;

    // 1. The host's own major.
    s_.begin("negotiate_host_major");
    uint32_t major = UINT32_MAX;
    const sieve_plugin* t = nullptr;
    sieve_status st = lib_.entry(host, &major, &t);
    mark("negotiate_host_major");
    bool ok = false;
    if (major == UINT32_MAX)
      fail("negotiate_host_major", "the plugin did not write its ABI major");
    else if (major != host)
      fail("negotiate_host_major", "ABI major " + std::to_string(major) + " (plugin) vs " +
                                          std::to_string(host) + " (host); returned " +
                                          status_name(st));
    else if (st != SIEVE_OK)
      fail("negotiate_host_major", "returned " + status_name(st) + " for its own major");
    else if (!t)
      fail("negotiate_host_major", "returned SIEVE_OK but no table");
    else {
      pass("negotiate_host_major", "major " + std::to_string(major));
      ok = true;
      table_ = t;
    }

    // 2. A newer host: the plugin answers its own major and serves it (older majors are
    //    served to newer hosts; the host decides whether it still speaks them).
    s_.begin("negotiate_newer_host");
    const uint32_t newer = host + 1;
    major = UINT32_MAX;
    t = nullptr;
    st = lib_.entry(newer, &major, &t);
    mark("negotiate_newer_host");
    if (major == UINT32_MAX)
      fail("negotiate_newer_host", "host offered " + std::to_string(newer) +
                                          ": the plugin did not write its ABI major");
    else if (major <= newer && (st != SIEVE_OK || !t))
      fail("negotiate_newer_host", "host offered " + std::to_string(newer) + ", plugin major " +
                                          std::to_string(major) + " <= offered, but returned " +
                                          status_name(st) + (t ? "" : " and no table") +
                                          " (it must serve its own major)");
    else if (major > newer && (st != SIEVE_ERR_VERSION || t))
      fail("negotiate_newer_host", "plugin major " + std::to_string(major) +
                                          " > offered " + std::to_string(newer) +
                                          " must be refused with SIEVE_ERR_VERSION and no table");
    else
      pass("negotiate_newer_host", "host offered " + std::to_string(newer) + ": plugin answered " +
                                          std::to_string(major) + ", " + status_name(st));

    // 3. Major 0 does not exist: refused with SIEVE_ERR_VERSION, *table cleared, major written.
    s_.begin("negotiate_major_0");
    static const sieve_plugin poison{};
    major = UINT32_MAX;
    t = &poison;
    st = lib_.entry(0, &major, &t);
    mark("negotiate_major_0");
    std::vector<std::string> bad;
    if (st != SIEVE_ERR_VERSION) bad.push_back("returned " + status_name(st) + ", expected SIEVE_ERR_VERSION");
    if (t != nullptr) bad.push_back("*table was not set to NULL");
    if (major == UINT32_MAX) bad.push_back("*plugin_major was not written");
    if (bad.empty()) pass("negotiate_major_0", "refused with SIEVE_ERR_VERSION, no table");
    else fail("negotiate_major_0", "host offered 0: " + join(bad));
    return ok;
  }

  bool tables() {
    auto report = [&](const char* name, const std::vector<std::string>& problems,
                      const std::string& ok_detail) {
      mark(name);
      if (problems.empty()) pass(name, ok_detail);
      else fail(name, join(problems));
      return problems.empty();
    };
    auto header = check_plugin_header(table_, SIEVE_ABI_MAJOR);
    if (!report("plugin_table", header,
                header.empty() ? "'" + std::string(table_->name) + "', struct_size " +
                                     std::to_string(table_->hdr.struct_size) + ", minor " +
                                     std::to_string(table_->hdr.version)
                               : "")) {
      skip_rest("the plugin table is malformed");
      return false;
    }

    if (table_->kv_store) {
      report("kv_store_table", check_kv_store_api(table_->kv_store),
             "KV store '" + std::string(table_->kv_store->name ? table_->kv_store->name : "") + "'");
    } else {
      mark("kv_store_table");
      skip("kv_store_table", "the plugin ships no KV store");
    }

    const sieve_policy_api* api = table_->policy;
    if (!api) {
      for (auto* n : {"policy_table", "descriptor", "schema"}) {
        mark(n);
        skip(n, "the plugin ships no policy");
      }
      skip_rest("the plugin ships no policy");
      return true;
    }
    bool ok = report("policy_table", check_policy_table(api),
                     "struct_size " + std::to_string(api->hdr.struct_size) + ", minor " +
                         std::to_string(api->hdr.version));
    if (api->hdr.struct_size < util::v1_0_size<sieve_policy_api>() || !api->descriptor) {
      skip_rest("the policy table is malformed");
      return false;
    }
    const auto* d = api->descriptor;
    bool dok = report("descriptor", check_policy_descriptor(d, api, table_->name),
                      SIEVE_HAS_FIELD(d, sieve_policy_descriptor, cuda_graph)
                          ? "phases " + phase_names(d->phases) + ", devices " +
                                device_names(d->devices) + ", dtypes " + dtype_names(d->dtypes)
                          : "");
    bool sok = true;
    if (api->n_params && !api->params) {
      mark("schema");
      skip("schema", "params is NULL (reported by policy_table)");
      sok = false;
    } else {
      sok = report("schema", check_schema(ParamSchema::of(*api)),
                   std::to_string(api->n_params) + " parameter(s)");
    }
    if (!ok || !dok || !sok) {
      skip_rest("the policy's tables, descriptor or schema failed");
      return false;
    }
    return true;
  }

  // validate(geometry, defaults): `expect_ok` or a refusal with at least one reason.
  void validate_case(const char* name, const sieve_geometry& g, bool expect_ok,
                     const std::string& what) {
    mark(name);
    s_.begin(name);
    Reasons r;
    sieve_status st = table_->policy->validate(&g, defaults_.data(), defaults_.size(), r.sink());
    std::string reasons = r.lines.empty() ? "no reason" : "reasons: " + join(r.lines);
    const bool empty_reason = r.empty_line();
    if (expect_ok) {
      if (st == SIEVE_OK && r.lines.empty()) pass(name, what);
      else if (st == SIEVE_OK) fail(name, what + ": SIEVE_OK but it also gave " + reasons);
      else fail(name, what + ": refused with " + status_name(st) + ", " + reasons);
      return;
    }
    if (st == SIEVE_OK) fail(name, what + ": accepted (SIEVE_OK), expected a refusal with a reason");
    else if (r.lines.empty()) fail(name, what + ": refused with " + status_name(st) + " but gave no reason");
    else if (empty_reason) fail(name, what + ": a reason was NULL or empty");
    else pass(name, what + ": " + status_name(st) + ", " + reasons);
  }

  // The descriptor's conformance parameters (ABI 1.1) must fit the schema: every later check
  // creates the plugin with them.
  bool conform_params_check(ParamPairs* params) {
    const auto& d = *table_->policy->descriptor;
    std::string err;
    ParamPairs declared;
    const std::string text = declared_conform_params(d);
    std::vector<std::string> errors;
    ParamValues values;
    if (!conform_param_pairs(d, {}, &declared, &err) ||
        !parse_params(ParamSchema::of(*table_->policy), declared, &values, &errors)) {
      fail("conform_params", err.empty() ? "conform_params \"" + text + "\" refused by the schema: " + join(errors) : err);
      return false;
    }
    if (text.empty()) skip("conform_params", "none declared: the checks use the schema defaults");
    else pass("conform_params", "\"" + text + "\"");
    return conform_param_pairs(d, options_.params, params, &err);
  }

  void validate_checks() {
    const auto& d = *table_->policy->descriptor;
    std::vector<std::string> errors;
    ParamPairs params;
    if (!conform_params_check(&params)) return skip_rest("the descriptor's conform_params do not fit the schema");
    // The schema passed, so its defaults parse; --param values may not.
    if (!parse_params(ParamSchema::of(*table_->policy), params, &defaults_, &errors)) {
      fail("validate_accepts_declared", "--param values refused: " + join(errors));
      return skip_rest("the --param values do not fit the schema");
    }
    const sieve_geometry g = declared_geometry(d, options_.geometry);
    validate_case("validate_accepts_declared", g, true, "declared geometry (" + geometry_text(g) + ")");

    sieve_geometry b = g;
    b.head_dim = 0;
    b.rope_dim = 0;
    validate_case("validate_rejects_head_dim_0", b, false, "head_dim 0");
    b = g;
    b.n_q_heads = 6;
    b.n_kv_heads = 4;
    validate_case("validate_rejects_gqa_mismatch", b, false, "6 query heads over 4 KV heads");
    b = g;
    b.page_size = 0;
    validate_case("validate_rejects_page_size_0", b, false, "page_size 0");

    mark("validate_rejects_unlisted_head_dim");
    if (d.n_head_dims == 0) {
      skip("validate_rejects_unlisted_head_dim", "the descriptor accepts any head dim");
    } else {
      b = g;
      b.head_dim = b.rope_dim = unlisted(d.head_dims, d.n_head_dims, {72, 40, 24, 8, 512});
      validate_case("validate_rejects_unlisted_head_dim", b, false,
                    "head_dim " + std::to_string(b.head_dim) + " (not declared)");
    }
    mark("validate_rejects_unlisted_page_size");
    if (d.n_page_sizes == 0) {
      skip("validate_rejects_unlisted_page_size", "the descriptor accepts any page size");
    } else {
      b = g;
      b.page_size = unlisted(d.page_sizes, d.n_page_sizes, {3, 7, 48, 1000});
      validate_case("validate_rejects_unlisted_page_size", b, false,
                    "page_size " + std::to_string(b.page_size) + " (not declared)");
    }
    mark("validate_rejects_unsupported_dtype");
    const uint32_t all_dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16;
    if ((d.dtypes & all_dtypes) == all_dtypes) {
      skip("validate_rejects_unsupported_dtype", "the descriptor declares every KV dtype");
    } else {
      b = g;
      b.kv_dtype = !(d.dtypes & SIEVE_DTYPE_BF16)  ? DLDataType{kDLBfloat, 16, 1}
                   : !(d.dtypes & SIEVE_DTYPE_F16) ? DLDataType{kDLFloat, 16, 1}
                                                   : DLDataType{kDLFloat, 32, 1};
      validate_case("validate_rejects_unsupported_dtype", b, false,
                    "KV dtype " + dtype_names(dtype_bit(b.kv_dtype)) + " (not declared)");
    }
    mark("validate_rejects_unsupported_device");
    if ((d.devices & (SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA)) ==
        (SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA)) {
      skip("validate_rejects_unsupported_device", "the descriptor declares cpu and cuda");
    } else {
      b = g;
      b.device = (d.devices & SIEVE_DEVICE_CPU) ? DLDevice{kDLCUDA, 0} : DLDevice{kDLCPU, 0};
      validate_case("validate_rejects_unsupported_device", b, false,
                    std::string("device ") + (b.device.device_type == kDLCUDA ? "cuda" : "cpu") +
                        " (not declared)");
    }
  }

  // create() must refuse bad input with a status and one error line, and free what it took.
  void create_case(const char* name, const sieve_geometry& g, const sieve_param_value* values,
                   uint32_t n_values, const std::string& what) {
    mark(name);
    s_.begin(name);
    MockHost host;
    Reasons err;
    sieve_policy* inst = nullptr;
    const auto* api = table_->policy;
    sieve_status st = api->create(host.services(), &g, values, n_values, nullptr, nullptr, &inst, err.sink());
    if (st == SIEVE_OK) {
      if (inst) api->destroy(inst);
      fail(name, what + ": create() returned SIEVE_OK");
      return;
    }
    std::vector<std::string> bad;
    if (err.lines.empty() || err.null_message) bad.push_back("no error line through the err sink");
    if (const size_t live = host.live_allocations())
      bad.push_back(std::to_string(live) + " host allocation(s) not freed");
    if (bad.empty())
      pass(name, what + ": " + status_name(st) + ", \"" + err.lines.front() + "\"");
    else
      fail(name, what + ": " + status_name(st) + " but " + join(bad));
  }

  void create_checks() {
    const auto* api = table_->policy;
    const sieve_geometry g = declared_geometry(*api->descriptor, options_.geometry);
    mark("create_rejects_missing_values");
    if (api->n_params == 0)
      skip("create_rejects_missing_values", "the schema has no parameters");
    else
      create_case("create_rejects_missing_values", g, nullptr, 0,
                  "n_values 0 for " + std::to_string(api->n_params) + " parameter(s)");
    sieve_geometry b = g;
    b.head_dim = b.rope_dim = 0;
    create_case("create_rejects_head_dim_0", b, defaults_.data(), defaults_.size(), "head_dim 0");
  }

  std::string path_;
  CheckSink& s_;
  const ConformOptions& options_;
  PluginLibrary lib_;
  const sieve_plugin* table_ = nullptr;
  ParamValues defaults_;
  std::map<std::string, bool> done_;
};

}  // namespace

ConformReport conform_static(const std::string& path, const ConformOptions& options) {
  ConformReport report;
  report.plugin_path = path;
  run_isolated([&](CheckSink& sink) { StaticChecks(path, sink, options).run(); }, "static",
               static_check_names(), options, &report);
  return report;
}

bool static_gate_passed(const ConformReport& report) {
  for (const char* name : {"file", "entry_symbol", "negotiate_host_major", "plugin_table"}) {
    const ConformCheck* c = report.find(name);
    if (!c || !c->passed) return false;
  }
  // Present only for what the plugin ships (skipped otherwise); none may have failed.
  for (const char* name : {"policy_table", "descriptor", "schema", "conform_params", "kv_store_table"}) {
    const ConformCheck* c = report.find(name);
    if (!c || (!c->passed && !c->skipped)) return false;
  }
  return true;
}

}  // namespace sieve::runtime
