#include "sieve/runtime/policy_hooks.hpp"

#include "sieve/util/hook_names.hpp"

namespace sieve::runtime {

uint32_t table_hooks(const sieve_policy_api& api) {
  const struct {
    bool present;
    uint32_t bit;
  } hooks[] = {{api.on_append != nullptr, SIEVE_HOOK_ON_APPEND}, {api.select != nullptr, SIEVE_HOOK_SELECT},
               {api.attend != nullptr, SIEVE_HOOK_ATTEND},       {api.observe != nullptr, SIEVE_HOOK_OBSERVE},
               {api.correct != nullptr, SIEVE_HOOK_CORRECT},     {api.end_step != nullptr, SIEVE_HOOK_END_STEP}};
  uint32_t bits = 0;
  for (const auto& h : hooks)
    if (h.present) bits |= h.bit;
  return bits;
}

bool hooks_per_instance(const sieve_policy_api& api) {
  return SIEVE_HAS_FIELD(&api, sieve_policy_api, instance_hooks) && api.instance_hooks;
}

uint32_t instance_hooks(const sieve_policy_api& api, const sieve_policy* p, std::string* error) {
  const uint32_t table = table_hooks(api);
  if (!hooks_per_instance(api)) return table;
  const uint32_t bits = api.instance_hooks(p);
  if (bits & ~table) {
    if (error)
      *error = "instance_hooks names " + hook_names(bits & ~table) +
               ", which its table does not implement (it implements " + hook_names(table) + ")";
    return 0;
  }
  return bits;
}

}  // namespace sieve::runtime
