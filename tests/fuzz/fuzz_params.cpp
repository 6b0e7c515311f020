// fuzz-links: sieve_runtime
// Parameter values (params.hpp): one value against each parameter type, then "k=v" lines against
// a schema of all six. Properties beyond "no crash": an accepted value is inside its declared
// range (ints, floats, every list element; floats finite; an enum index names a listed choice),
// and every refusal is one line of printable text (fuzz_check.hpp).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "sieve/runtime/params.hpp"

namespace {

using sieve::fuzz::check_message_line;
using sieve::fuzz::violated;

sieve_param_spec param(const char* name, uint32_t type, const char* def, double min, double max,
                       const char* choices = nullptr) {
  return {.hdr = SIEVE_HEADER_INIT(sieve_param_spec), .name = name, .type = type, .default_value = def,
          .min = min, .max = max, .choices = choices, .doc = "fuzzed"};
}

// Ranges at the awkward edges: negative, beyond 2^53 (doubles stop being exact), a point range.
const sieve_param_spec kSchema[] = {
    param("flag", SIEVE_PARAM_BOOL, "false", 0, 0),
    param("budget", SIEVE_PARAM_INT, "64", -5, 9007199254740993.0),
    param("tau", SIEVE_PARAM_FLOAT, "0.5", 0, 1),
    param("path", SIEVE_PARAM_STRING, "", 0, 0),
    param("mode", SIEVE_PARAM_ENUM, "a", 0, 0, "a|bb|ccc"),
    param("layers", SIEVE_PARAM_INT_LIST, "[]", 0, 64),
    param("point", SIEVE_PARAM_INT, "7", 7, 7),
};

void check_value(const sieve_param_spec& spec, const sieve_param_value& v, const std::vector<int64_t>& list,
                 const std::string& text) {
  const auto in = [&](double x) { return x >= spec.min && x <= spec.max; };
  switch (spec.type) {
    case SIEVE_PARAM_BOOL:
      if (v.i != 0 && v.i != 1) violated("a bool that is neither 0 nor 1", text);
      break;
    case SIEVE_PARAM_INT:
      if (!in(double(v.i))) violated("an int accepted outside its range", text);
      break;
    case SIEVE_PARAM_FLOAT:
      if (!std::isfinite(v.f) || !in(v.f)) violated("a float accepted non-finite or outside its range", text);
      break;
    case SIEVE_PARAM_ENUM:
      if (v.i < 0 || v.i > 2) violated("an enum index past its choices", text);
      break;
    case SIEVE_PARAM_INT_LIST:
      for (int64_t x : list)
        if (!in(double(x))) violated("a list element accepted outside its range", text);
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  // 1. The whole input as the value of each parameter.
  for (const auto& spec : kSchema) {
    sieve_param_value v;
    std::string owned;
    std::vector<int64_t> list;
    const std::string why = sieve::runtime::parse_param_value(spec, text, &v, &owned, &list);
    if (why.empty()) check_value(spec, v, list, text);
    else check_message_line(why);
  }

  // 2. Lines "key=value" (a line without '=' is a key with an empty value) against the schema.
  sieve::runtime::ParamPairs pairs;
  for (size_t start = 0; start <= text.size();) {
    const size_t nl = std::min(text.find('\n', start), text.size());
    const std::string line = text.substr(start, nl - start);
    const size_t eq = line.find('=');
    pairs.emplace_back(line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1));
    start = nl + 1;
  }
  const sieve::runtime::ParamSchema schema(kSchema, uint32_t(std::size(kSchema)));
  sieve::runtime::ParamValues values;
  std::vector<std::string> errors;
  if (sieve::runtime::parse_params(schema, pairs, &values, &errors, "fuzzed")) {
    if (values.size() != schema.size()) violated("parse_params succeeded without every parameter", text);
    for (uint32_t i = 0; i < values.size(); ++i)
      if (values[i].type != schema[i].type) violated("a value of the wrong type", text);
  } else {
    if (errors.empty()) violated("parse_params failed without a reason", text);
    for (const auto& e : errors) check_message_line(e);
  }
  return 0;
}
