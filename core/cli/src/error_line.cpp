#include "sieve/cli/error_line.hpp"

#include <cstdio>
#include <exception>

#include "sieve/util/printable.hpp"

namespace sieve::cli {

std::string one_line(std::string_view message) {
  while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  std::string out;
  for (size_t start = 0;;) {
    const size_t nl = message.find('\n', start);
    if (start) out += "; ";
    out += printable(message.substr(start, nl == std::string_view::npos ? nl : nl - start), std::string::npos);
    if (nl == std::string_view::npos) return out;
    start = nl + 1;
  }
}

int report_error(std::string_view command, std::string_view message, int status) {
  const std::string line = std::string(command) + ": " + one_line(message) + "\n";
  std::fputs(line.c_str(), stderr);
  return status;
}

int run_guarded(std::string_view command, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return report_error(command, e.what(), 1);
  } catch (...) {
    return report_error(command, "unexpected non-standard exception", 1);
  }
}

}  // namespace sieve::cli
