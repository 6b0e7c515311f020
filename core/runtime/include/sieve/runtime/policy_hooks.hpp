// Which hooks a policy table implements and which of them one instance uses (ABI 1.1
// sieve_policy_api.instance_hooks). The layer runner calls, and the chain checks count, only an
// instance's hooks: a dpxa instance with mode=select is a selector even though its table has attend.
#pragma once
#include <sieve/sieve.h>

#include <cstdint>
#include <string>

namespace sieve::runtime {

// The sieve_hook_bits of the table's non-NULL hooks.
uint32_t table_hooks(const sieve_policy_api& api);

// The table answers instance_hooks (ABI 1.1 field present and non-NULL): an instance's hooks are
// known only after create. Otherwise every instance uses table_hooks().
bool hooks_per_instance(const sieve_policy_api& api);

// The hooks instance `p` of `api` uses, asked once after create: instance_hooks(p), or
// table_hooks(api) when the table does not answer it. Bits outside table_hooks(api) are refused:
// *error says which (by name), and the result is 0.
uint32_t instance_hooks(const sieve_policy_api& api, const sieve_policy* p, std::string* error);

}  // namespace sieve::runtime
