#include "parse_options.hpp"

#include <cstdio>
#include <iostream>

namespace po = boost::program_options;

namespace sieve::cli {

std::optional<int> parse_options(const char* command, const po::options_description& opts, int argc, char** argv,
                                 po::variables_map* vm) {
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), *vm);
    po::notify(*vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", command, e.what());
    return 2;
  }
  if (vm->count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  return std::nullopt;
}

}  // namespace sieve::cli
