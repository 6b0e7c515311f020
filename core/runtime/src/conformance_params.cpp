// What conformance creates a plugin with: the parameter set its descriptor declares for
// conformance (ABI 1.1 `conform_params`), with `--param` values on top.
#include <map>

#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/conformance.hpp"

namespace sieve::runtime {

const char* declared_conform_params(const sieve_policy_descriptor& d) {
  if (!SIEVE_HAS_FIELD(&d, sieve_policy_descriptor, conform_params) || !d.conform_params) return "";
  return d.conform_params;
}

uint32_t declared_selection_basis(const sieve_policy_descriptor& d) {
  if (!SIEVE_HAS_FIELD(&d, sieve_policy_descriptor, selection_basis)) return SIEVE_SELECTION_BASIS_UNDECLARED;
  return d.selection_basis;
}

const char* selection_basis_name(uint32_t basis) {
  switch (basis) {
    case SIEVE_SELECTION_BASIS_CONTENT: return "content";
    case SIEVE_SELECTION_BASIS_POSITIONAL: return "positional";
    case SIEVE_SELECTION_BASIS_NONE: return "none";
    default: return "undeclared";
  }
}

bool conform_param_pairs(const sieve_policy_descriptor& d, const ParamPairs& given, ParamPairs* out,
                         std::string* error) {
  out->clear();
  const std::string declared = declared_conform_params(d);
  if (!declared.empty()) {
    // The chain grammar's parameter list (brackets for int lists, quotes), so the text means
    // what it would mean in `--chain 'name(...)'`.
    ChainSpec spec;
    std::string why;
    if (!parse_chain_spec("0=" + std::string(d.name ? d.name : "plugin") + "(" + declared + ")", &spec, &why)) {
      if (error) *error = "conform_params \"" + declared + "\" do not parse: " + why;
      return false;
    }
    *out = spec.instances.at(0).params;
  }
  for (const auto& [key, value] : given) {  // --param replaces a declared value of that name
    bool replaced = false;
    for (auto& kv : *out)
      if (kv.first == key) kv.second = value, replaced = true;
    if (!replaced) out->emplace_back(key, value);
  }
  return true;
}

}  // namespace sieve::runtime
