// Conformance's process isolation (conformance_isolation.hpp): check records through a pipe.
#include "conformance_isolation.hpp"

#include <chrono>
#include <cstring>

#include "child_process.hpp"

namespace sieve::runtime {

namespace {

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
  void begin(const std::string& name) override { send('B', {name, false, false, "", ""}); }
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

}  // namespace

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

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += "; ";
    out += v[i];
  }
  return out;
}

sieve_reason_sink Reasons::sink() {
  return {this, [](void* ctx, const char* m) {
            auto* r = static_cast<Reasons*>(ctx);
            if (!m) r->null_message = true;
            else r->lines.push_back(m);
          }};
}

bool Reasons::empty_line() const {
  if (null_message) return true;
  for (const auto& l : lines)
    if (l.empty()) return true;
  return false;
}

}  // namespace sieve::runtime
