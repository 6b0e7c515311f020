// Parameters: constexpr builders for the schema a policy declares, and typed access by name to
// the validated values the host hands to validate/create (in schema order, defaults filled in).
#pragma once
#include <sieve/policy.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "sieve/plugin/reasons.hpp"

namespace sieve::plugin {

// ---- Schema builders (usable in a `static constexpr sieve_param_spec kParams[]`) -------------
constexpr sieve_param_spec param_spec(const char* name, sieve_param_type type,
                                      const char* default_value, double min, double max,
                                      const char* choices, const char* doc) {
  return sieve_param_spec{SIEVE_HEADER_INIT(sieve_param_spec), name, uint32_t(type), default_value,
                          min, max, choices, doc};
}
constexpr sieve_param_spec int_param(const char* name, const char* default_value, double min,
                                     double max, const char* doc) {
  return param_spec(name, SIEVE_PARAM_INT, default_value, min, max, nullptr, doc);
}
constexpr sieve_param_spec float_param(const char* name, const char* default_value, double min,
                                       double max, const char* doc) {
  return param_spec(name, SIEVE_PARAM_FLOAT, default_value, min, max, nullptr, doc);
}
constexpr sieve_param_spec bool_param(const char* name, const char* default_value, const char* doc) {
  return param_spec(name, SIEVE_PARAM_BOOL, default_value, 0, 1, nullptr, doc);
}
constexpr sieve_param_spec string_param(const char* name, const char* default_value,
                                        const char* doc) {
  return param_spec(name, SIEVE_PARAM_STRING, default_value, 0, 0, nullptr, doc);
}
// `choices` is "a|b|c"; the value's index is value.i, its text value.s.
constexpr sieve_param_spec enum_param(const char* name, const char* default_value,
                                      const char* choices, const char* doc) {
  return param_spec(name, SIEVE_PARAM_ENUM, default_value, 0, 0, choices, doc);
}
constexpr sieve_param_spec int_list_param(const char* name, const char* default_value, double min,
                                          double max, const char* doc) {
  return param_spec(name, SIEVE_PARAM_INT_LIST, default_value, min, max, nullptr, doc);
}

// ---- Values ----------------------------------------------------------------------------------
// A borrowed view of (schema, values). Lookups are by the schema's name; asking for a name the
// schema does not have is a plugin bug (INTERNAL); a value of the wrong type or out of the
// schema's range is the host's (INVALID_ARGUMENT) and is caught by check() before any lookup.
class Params {
 public:
  Params() = default;
  // Throws Error(INVALID_ARGUMENT) naming every problem check() finds.
  Params(const sieve_param_spec* specs, uint32_t n_specs, const sieve_param_value* values,
         uint32_t n_values);

  // Report every mismatch between the values and the schema (count, type, range, enum index,
  // null strings) to `reasons`; true when there was none.
  static bool check(const sieve_param_spec* specs, uint32_t n_specs,
                    const sieve_param_value* values, uint32_t n_values, Reasons& reasons);

  int64_t integer(std::string_view name) const;   // INT
  double real(std::string_view name) const;       // FLOAT
  bool boolean(std::string_view name) const;      // BOOL
  std::string_view text(std::string_view name) const;  // STRING, or an ENUM's choice text
  uint32_t choice(std::string_view name) const;   // ENUM index
  std::span<const int64_t> int_list(std::string_view name) const;  // INT_LIST

  uint32_t size() const noexcept { return n_; }
  const sieve_param_spec* specs() const noexcept { return specs_; }

 private:
  const sieve_param_value& value(std::string_view name, sieve_param_type type) const;

  const sieve_param_spec* specs_ = nullptr;
  const sieve_param_value* values_ = nullptr;
  uint32_t n_ = 0;
};

const char* param_type_name(uint32_t type) noexcept;

}  // namespace sieve::plugin
