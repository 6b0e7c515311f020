// How conformance runs checks that call plugin code: each part in a forked child whose check
// results come back through a pipe, so a crash or a hang fails the check that was running instead
// of ending the run (the static part, the numeric part and the KV-store suite all use it).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "sieve/runtime/conformance.hpp"

namespace sieve::runtime {

// Where check results go: straight into a report, or through a pipe from a child.
class CheckSink {
 public:
  virtual ~CheckSink() = default;
  virtual void begin(const std::string& name) = 0;  // a check that calls plugin code starts
  virtual void done(const ConformCheck& check) = 0;
  virtual void end() {}  // the part that was begun finished without a check of that name
  void pass(const std::string& n, const std::string& d = "") { done({n, true, false, d, ""}); }
  void fail(const std::string& n, const std::string& d) { done({n, false, false, d, ""}); }
  void skip(const std::string& n, const std::string& d) { done({n, false, true, d, ""}); }
};

// Runs `body` in a forked child (child_process.hpp) unless options.isolate is off or fork()
// fails (then in this process). A crash, hang or exit of the child fails the check that was
// running (or `part` when none was) with the signal or the timeout, and every name of
// `expected` the child never reported is listed as skipped ("not run: ...").
void run_isolated(const std::function<void(CheckSink&)>& body, const std::string& part,
                  const std::vector<std::string>& expected, const ConformOptions& options,
                  ConformReport* report);

// "a; b; c".
std::string join(const std::vector<std::string>& lines);

// A sieve_reason_sink that keeps every line a plugin or a store gives.
struct Reasons {
  std::vector<std::string> lines;
  bool null_message = false;
  sieve_reason_sink sink();
  // Some line was NULL or empty.
  bool empty_line() const;
};

}  // namespace sieve::runtime
