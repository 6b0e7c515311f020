#include "sieve/cli/parse_options.hpp"

#include <cmath>
#include <iostream>
#include <string>

#include "sieve/cli/error_line.hpp"
#include "sieve/util/printable.hpp"

namespace po = boost::program_options;

namespace sieve::cli {

namespace {

// The first float or double option that holds nan or inf, as "--name"; "" when none does.
std::string non_finite_option(const po::variables_map& vm) {
  for (const auto& [name, v] : vm) {
    const auto& type = v.value().type();
    double x = 0;
    if (type == typeid(float)) x = double(v.as<float>());
    else if (type == typeid(double)) x = v.as<double>();
    if (!std::isfinite(x)) return "--" + name;
  }
  return {};
}

}  // namespace

std::optional<int> parse_options(const char* command, const po::options_description& opts, int argc,
                                 const char* const* argv, po::variables_map* vm,
                                 const po::positional_options_description* positional) {
  try {
    po::parsed_options parsed = po::command_line_parser(argc, argv).options(opts).run();
    // Words without an option fill the positional names in order; one more is refused.
    unsigned taken = 0;
    for (po::option& o : parsed.options)
      if (o.position_key >= 0 && o.string_key.empty() && !o.value.empty()) {
        if (positional && taken < positional->max_total_count()) {
          o.string_key = positional->name_for_position(taken++);
          continue;
        }
        return report_error(command, "unexpected argument '" + printable(o.value.front()) +
                                         "' (every option takes one word: quote a value with spaces)", 2);
      }
    po::store(parsed, *vm);
    po::notify(*vm);
  } catch (const std::exception& e) {
    return report_error(command, e.what(), 2);
  }
  if (const std::string bad = non_finite_option(*vm); !bad.empty())
    return report_error(command, bad + " must be a finite number", 2);
  if (vm->count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  return std::nullopt;
}

}  // namespace sieve::cli
