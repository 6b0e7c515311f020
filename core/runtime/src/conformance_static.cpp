// Static ABI conformance (see conformance.hpp) and the process isolation both parts run under.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "child_process.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/descriptor_names.hpp"
#include "sieve/util/abi_v1_0.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/status.hpp"
#include "sieve/runtime/params.hpp"

namespace sieve::runtime {

bool ConformReport::passed() const {
  if (checks.empty()) return false;
  for (const auto& c : checks)
    if (!c.passed && !c.skipped) return false;
  return true;
}
const ConformCheck* ConformReport::find(const std::string& name) const {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
}
void ConformReport::pass(const std::string& name, const std::string& detail) {
  checks.push_back({name, true, false, detail});
}
void ConformReport::fail(const std::string& name, const std::string& detail) {
  checks.push_back({name, false, false, detail});
}
void ConformReport::skip(const std::string& name, const std::string& detail) {
  checks.push_back({name, false, true, detail});
}

namespace {

// ---- Where check results go: straight into a report, or through a pipe from a child ---------

class CheckSink {
 public:
  virtual ~CheckSink() = default;
  virtual void begin(const std::string& name) = 0;  // a check that calls plugin code starts
  virtual void done(const ConformCheck& check) = 0;
  virtual void end() {}  // the part that was begun finished without a check of that name
  void pass(const std::string& n, const std::string& d = "") { done({n, true, false, d}); }
  void fail(const std::string& n, const std::string& d) { done({n, false, false, d}); }
  void skip(const std::string& n, const std::string& d) { done({n, false, true, d}); }
};

class ReportSink : public CheckSink {
 public:
  explicit ReportSink(ConformReport* r) : r_(r) {}
  void begin(const std::string&) override {}
  void done(const ConformCheck& c) override { r_->checks.push_back(c); }

 private:
  ConformReport* r_;
};

// Record: kind ('B' begin / 'C' check), passed, skipped, name length + bytes, detail length + bytes.
class PipeSink : public CheckSink {
 public:
  explicit PipeSink(int fd) : fd_(fd) {}
  void begin(const std::string& name) override { send('B', {name, false, false, ""}); }
  void done(const ConformCheck& c) override { send('C', c); }
  void end() override { send('E', {}); }

 private:
  void send(char kind, const ConformCheck& c) {
    std::string rec(1, kind);
    rec += char(c.passed);
    rec += char(c.skipped);
    auto put = [&](const std::string& s) {
      uint32_t n = uint32_t(s.size());
      rec.append(reinterpret_cast<const char*>(&n), sizeof n);
      rec += s;
    };
    put(c.name);
    put(c.detail);
    write_all(fd_, rec);  // false: the parent is gone, nothing to report to
  }
  int fd_;
};

// Parse the records a child sent; returns the name of a check begun but not completed.
std::string read_records(const std::string& buf, ConformReport* report) {
  std::string pending;
  size_t at = 0;
  auto get = [&](std::string* s) {
    uint32_t n;
    if (at + sizeof n > buf.size()) return false;
    std::memcpy(&n, buf.data() + at, sizeof n);
    at += sizeof n;
    if (at + n > buf.size()) return false;
    *s = buf.substr(at, n);
    at += n;
    return true;
  };
  while (at + 3 <= buf.size()) {
    char kind = buf[at];
    ConformCheck c;
    c.passed = buf[at + 1] != 0;
    c.skipped = buf[at + 2] != 0;
    at += 3;
    if (!get(&c.name) || !get(&c.detail)) break;
    if (kind == 'B') {
      pending = c.name;
    } else if (kind == 'E') {
      pending.clear();
    } else {
      report->checks.push_back(c);
      if (c.name == pending) pending.clear();
    }
  }
  return pending;
}

// Run `body` in a forked child (child_process.hpp); its checks come back through a pipe. A crash
// or a hang fails the check that was running. Falls back to running in-process if fork() fails.
void run_isolated(const std::function<void(CheckSink&)>& body, const std::string& part,
                  const std::vector<std::string>& expected, const ConformOptions& options,
                  ConformReport* report) {
  ChildResult child;
  if (options.isolate)
    child = run_in_child(
        [&](int fd) {
          PipeSink sink(fd);
          try {
            body(sink);
          } catch (const std::exception& e) {
            sink.fail(part, std::string("conformance harness error: ") + e.what());
          }
        },
        std::chrono::seconds(options.timeout_s));
  if (!child.forked) {
    ReportSink sink(report);
    body(sink);
    return;
  }
  std::string pending = read_records(child.output, report);
  std::string during = pending.empty() ? part : pending;
  const bool timed_out = child.timed_out;
  if (timed_out) {
    report->fail(during, "timed out after " + std::to_string(options.timeout_s) +
                             " s (the plugin hangs); later " + part + " checks did not run");
  } else if (child.term_signal) {
    report->fail(during, std::string("plugin crashed (") + strsignal(child.term_signal) +
                             ", signal " + std::to_string(child.term_signal) + "); later " + part +
                             " checks did not run");
  } else if (child.exit_status) {
    report->fail(during, "the plugin ended the process with exit status " +
                             std::to_string(child.exit_status));
  } else if (!pending.empty()) {
    report->fail(pending, "the check started but never finished (the plugin exited?)");
  }
  if (child.died())  // the checks the child never reached are listed, as not run
    for (const auto& name : expected)
      if (!report->find(name))
        report->skip(name, "not run: the plugin " +
                               std::string(timed_out ? "hung" : "crashed") + " in " + during);
}

// ---- Minimal host services for create(): aligned_alloc memory, spdlog logging ----------------

struct MockHost {
  std::mutex mu;
  std::map<void*, size_t> live;  // outstanding allocations -> bytes
};

void* mock_alloc(void* ctx, DLDevice dev, size_t bytes, size_t alignment) {
  if (dev.device_type != kDLCPU) return nullptr;  // static conformance has no device memory
  auto* h = static_cast<MockHost*>(ctx);
  alignment = std::max<size_t>(alignment, 16);
  if (alignment & (alignment - 1)) return nullptr;
  size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (p) {
    std::lock_guard<std::mutex> lock(h->mu);
    h->live[p] = bytes;
  }
  return p;
}
void mock_free(void* ctx, DLDevice, void* p) {
  if (!p) return;
  auto* h = static_cast<MockHost*>(ctx);
  std::lock_guard<std::mutex> lock(h->mu);
  if (h->live.erase(p)) std::free(p);
  else spdlog::error("conformance host: free() of a pointer it did not allocate");
}
void* mock_stream(void*) { return nullptr; }
void mock_log(void*, sieve_log_level level, const char* source, const char* message) {
  auto lvl = level >= SIEVE_LOG_ERROR ? spdlog::level::err
             : level == SIEVE_LOG_WARN ? spdlog::level::warn
             : level == SIEVE_LOG_INFO ? spdlog::level::info
                                        : spdlog::level::debug;
  spdlog::log(lvl, "[{}] {}", source ? source : "?", message ? message : "");
}
uint64_t mock_now(void*) {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count());
}
sieve_status mock_attend(void*, const sieve_attention_args*) { return SIEVE_ERR_UNSUPPORTED; }
const char* mock_kernel_error(void*) { return "static conformance runs no kernels"; }
void mock_metric(void*, const char*, int32_t, int32_t, double) {}

// ---- The static checks -------------------------------------------------------------------------

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += "; ";
    out += v[i];
  }
  return out;
}

struct Reasons {
  std::vector<std::string> lines;
  bool null_message = false;
  sieve_reason_sink sink() {
    return {this, [](void* ctx, const char* m) {
              auto* r = static_cast<Reasons*>(ctx);
              if (!m) r->null_message = true;
              else r->lines.push_back(m);
            }};
  }
};

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
    bool empty_reason = r.null_message ||
                        std::any_of(r.lines.begin(), r.lines.end(),
                                    [](const std::string& l) { return l.empty(); });
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
    sieve_kernels kernels{SIEVE_HEADER_INIT(sieve_kernels), mock_attend, mock_kernel_error};
    sieve_host_services services{SIEVE_HEADER_INIT(sieve_host_services), &host, mock_alloc,
                                 mock_free, mock_stream, mock_log, mock_now, &kernels,
                                 mock_metric};
    Reasons err;
    sieve_policy* inst = nullptr;
    const auto* api = table_->policy;
    sieve_status st = api->create(&services, &g, values, n_values, nullptr, nullptr, &inst, err.sink());
    if (st == SIEVE_OK) {
      if (inst) api->destroy(inst);
      fail(name, what + ": create() returned SIEVE_OK");
      return;
    }
    std::vector<std::string> bad;
    if (err.lines.empty() || err.null_message) bad.push_back("no error line through the err sink");
    if (!host.live.empty())
      bad.push_back(std::to_string(host.live.size()) + " host allocation(s) not freed");
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

// A geometry the descriptor declares it supports.
sieve_geometry declared_geometry(const sieve_policy_descriptor& d) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 4;
  g.n_q_heads = 8;
  g.n_kv_heads = 2;
  g.head_dim = d.n_head_dims ? d.head_dims[0] : 128;
  for (uint32_t i = 0; i < d.n_head_dims; ++i)  // prefer a common size when several are listed
    if (d.head_dims[i] == 128) g.head_dim = 128;
  g.page_size = d.n_page_sizes ? d.page_sizes[0] : 16;
  for (uint32_t i = 0; i < d.n_page_sizes; ++i)
    if (d.page_sizes[i] == 16) g.page_size = 16;
  g.max_batch = 4;
  g.max_seq_len = 4096;
  g.kv_dtype = (d.dtypes & SIEVE_DTYPE_F32)   ? DLDataType{kDLFloat, 32, 1}
               : (d.dtypes & SIEVE_DTYPE_F16) ? DLDataType{kDLFloat, 16, 1}
                                              : DLDataType{kDLBfloat, 16, 1};
  g.device = (d.devices & SIEVE_DEVICE_CPU) ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, 0};
  g.rope_theta = 10000.f;
  g.rope_dim = g.head_dim;
  return g;
}

sieve_geometry declared_geometry(const sieve_policy_descriptor& d, const GeometryOverride& o) {
  sieve_geometry g = declared_geometry(d);
  if (o.n_q_heads) g.n_q_heads = o.n_q_heads;
  if (o.n_kv_heads) g.n_kv_heads = o.n_kv_heads;
  if (o.head_dim) g.head_dim = g.rope_dim = o.head_dim;
  if (o.page_size) g.page_size = o.page_size;
  if (o.kv_dtype.bits) g.kv_dtype = o.kv_dtype;
  if (o.n_layers) g.n_layers = o.n_layers;
  return g;
}

bool parse_geometry_override(const std::string& text, GeometryOverride* out, std::string* error) {
  GeometryOverride g;
  auto bad = [&](const std::string& m) {
    if (error) *error = "--geometry '" + text + "': " + m;
    return false;
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return bad("'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "dtype") {
      if (value == "f32") g.kv_dtype = DLDataType{kDLFloat, 32, 1};
      else if (value == "f16") g.kv_dtype = DLDataType{kDLFloat, 16, 1};
      else if (value == "bf16") g.kv_dtype = DLDataType{kDLBfloat, 16, 1};
      else return bad("dtype '" + value + "': allowed are f32, f16, bf16");
      continue;
    }
    int32_t* field = key == "hq" ? &g.n_q_heads : key == "hkv" ? &g.n_kv_heads : key == "d" ? &g.head_dim
                   : key == "page" ? &g.page_size : key == "layers" ? &g.n_layers : nullptr;
    if (!field) return bad("unknown key '" + key + "': allowed are hq, hkv, d, page, dtype, layers");
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end || v < 1 || v > 65536) return bad(key + " = '" + value + "': an integer in [1, 65536]");
    *field = int32_t(v);
  }
  if (g.n_q_heads && g.n_kv_heads && g.n_q_heads % g.n_kv_heads)
    return bad("hq " + std::to_string(g.n_q_heads) + " is not a multiple of hkv " + std::to_string(g.n_kv_heads));
  *out = g;
  return true;
}

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

ConformReport conform(const std::string& path, const ConformOptions& options) {
  ConformReport report = conform_static(path, options);
  if (!static_gate_passed(report)) {
    report.skip("numeric", "not run: the static checks it relies on failed");
    return report;
  }
  run_isolated(
      [&](CheckSink& sink) {
        LoadedPlugin plugin;
        std::string err;
        if (!load_plugin(path, &plugin, &err)) {
          sink.fail("numeric", "loading for the numeric checks failed: " + err);
          return;
        }
        sink.begin("numeric");
        ConformReport part;
        part.plugin_path = path;
        conform_numeric(plugin, &part, options);
        for (const auto& c : part.checks) sink.done(c);
        sink.end();
      },
      "numeric", {}, options, &report);
  return report;
}

}  // namespace sieve::runtime
