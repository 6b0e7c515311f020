// A shell command's exit status and output, for the tests of the command-line tools.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace sieve::testing {

struct CommandResult {
  int status = -1;  // the exit code; 128 + the signal when killed; -1 when no shell started
  std::string out;  // stdout (add 2>&1 to the command for stderr too)
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace sieve::testing
