// Policy parameters: user `key=value` text validated against a policy's declared schema.
//
// Value syntax (the same for user input and for a schema's default_value text):
//   bool      true|false|1|0|yes|no|on|off
//   int       a decimal integer, e.g. 64, -3
//   float     a decimal or exponent number, e.g. 0.5, 1e-3 (finite)
//   string    any text (in a chain spec, quote it "..." if it holds , ( ) or spaces)
//   enum      one of the schema's choices "a|b|c"
//   int_list  comma-separated integers, optionally in brackets: [2,14,22] or 2,14,22;
//             "[]" or "" is the empty list. In a chain spec write the brackets (the commas
//             would otherwise separate parameters).
// Ranges [min, max] are inclusive and apply to int, float and every element of an int_list.
#pragma once

#include <sieve/policy.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sieve::runtime {

// A view of a policy's parameter array. The array's element stride is the struct_size its first
// element declares, so a plugin built against a later minor (a larger sieve_param_spec) still
// indexes correctly; only the v1.0 fields are read.
class ParamSchema {
 public:
  ParamSchema() = default;
  ParamSchema(const sieve_param_spec* specs, uint32_t n);
  static ParamSchema of(const sieve_policy_api& api) { return {api.params, api.n_params}; }

  uint32_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const sieve_param_spec& operator[](uint32_t i) const {
    return *reinterpret_cast<const sieve_param_spec*>(base_ + size_t(i) * stride_);
  }
  // Index of the parameter called `name`, or -1.
  int find(const std::string& name) const;

 private:
  const char* base_ = nullptr;
  size_t stride_ = sizeof(sieve_param_spec);
  uint32_t n_ = 0;
};

using ParamPairs = std::vector<std::pair<std::string, std::string>>;

// Validated values in schema order, every parameter present. Owns the text and list storage the
// sieve_param_value pointers borrow, and keeps those pointers valid across copies and moves.
class ParamValues {
 public:
  ParamValues() = default;
  ParamValues(const ParamValues& o) : values_(o.values_), text_(o.text_), lists_(o.lists_) { relink(); }
  ParamValues(ParamValues&& o) noexcept
      : values_(std::move(o.values_)), text_(std::move(o.text_)), lists_(std::move(o.lists_)) {
    relink();
  }
  ParamValues& operator=(const ParamValues& o) {
    if (this != &o) { values_ = o.values_; text_ = o.text_; lists_ = o.lists_; relink(); }
    return *this;
  }
  ParamValues& operator=(ParamValues&& o) noexcept {
    values_ = std::move(o.values_); text_ = std::move(o.text_); lists_ = std::move(o.lists_);
    relink();
    return *this;
  }

  const sieve_param_value* data() const { return values_.data(); }
  uint32_t size() const { return uint32_t(values_.size()); }
  const sieve_param_value& operator[](uint32_t i) const { return values_[i]; }
  // Text of value i (strings and enum choices), and the list of an int_list value.
  const std::string& text(uint32_t i) const { return text_[i]; }
  const std::vector<int64_t>& list(uint32_t i) const { return lists_[i]; }

  // Used by parse_params: append one value (its s/list pointers are set by relink).
  void push(const sieve_param_value& v, std::string text, std::vector<int64_t> list);

 private:
  void relink();
  std::vector<sieve_param_value> values_;
  std::vector<std::string> text_;
  std::vector<std::vector<int64_t>> lists_;
};

// Parse one value of a parameter (user text or the default). Returns "" on success, else the
// reason, e.g. "top_k=0 is out of range [1, 4096]".
std::string parse_param_value(const sieve_param_spec& spec, const std::string& text,
                              sieve_param_value* value, std::string* owned_text,
                              std::vector<int64_t>* owned_list);

// Validate user pairs against the schema: unknown names (with the closest known name), a name
// given twice, wrong types, out-of-range values (naming the range), bad enum choices (listing the
// choices). Defaults fill what the user did not give. Every problem is appended to *errors, one
// line each; returns true when there were none. `who` prefixes the lines ("quest: ...").
bool parse_params(const ParamSchema& schema, const ParamPairs& user, ParamValues* out,
                  std::vector<std::string>* errors, const std::string& who = "");

// Sanity of a schema itself (conformance and the loader): names [a-z0-9_]+ and unique, a known
// type, non-empty doc, min <= max for ranged types, enum choices present and non-empty, and every
// default parses and lies within its range. One line per problem.
std::vector<std::string> check_schema(const ParamSchema& schema);

// The schema as a --help style listing, one parameter per line:
//   "  top_k     int       = 64       [1, 4096]  pages kept per KV head"
std::string format_schema(const ParamSchema& schema, const std::string& indent = "  ");

// "int", "float", ... for a sieve_param_type.
const char* param_type_name(uint32_t type);

// The names in `candidates` closest to `name` (edit distance), for "did you mean" hints.
std::string closest_name(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace sieve::runtime
