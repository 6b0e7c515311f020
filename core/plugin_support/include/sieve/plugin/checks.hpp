// Checks every policy needs at the boundary: a struct the host passed is present and at least as
// large as ABI v1.0 made it; a geometry fits the policy's descriptor; a selection's storage can
// hold what the policy is about to write. Each reports a message that names the problem.
#pragma once
#include <sieve/sieve.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "sieve/plugin/error.hpp"
#include "sieve/plugin/reasons.hpp"

namespace sieve::plugin {

// The size of each crossing struct in ABI v1.0 (up to the end of its last v1.0 field). Pinned by
// field, not sizeof, so a plugin rebuilt against a later minor still accepts a v1.0 host.
template <class T>
struct v1_size;
#define SIEVE_PLUGIN_PIN_V1_SIZE(T, last_field)                                \
  template <>                                                                  \
  struct v1_size<T> {                                                          \
    static constexpr size_t value = offsetof(T, last_field) + sizeof(T::last_field); \
  };
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_geometry, rope_dim)
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_host_services, kernels)
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_layer_call, kv_view)
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_step_end, kv_api)
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_selection, capacity)
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_kv_append, k_pre_rope)
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_attention_stats, lse)
SIEVE_PLUGIN_PIN_V1_SIZE(sieve_paged_kv, k_pre_rope_pages)
#undef SIEVE_PLUGIN_PIN_V1_SIZE

// Throw INVALID_ARGUMENT if `p` is NULL, VERSION if its header says it is smaller than v1.0.
template <class T>
void require_struct(const T* p, const char* what) {
  if (!p) fail(SIEVE_ERR_INVALID_ARGUMENT, what, " is NULL");
  if (p->hdr.struct_size < v1_size<T>::value)
    fail(SIEVE_ERR_VERSION, what, " is ", p->hdr.struct_size, " bytes (struct_size), ABI v1.0 needs ",
         v1_size<T>::value);
}

// Report, without throwing, every way `g` is malformed or outside what `d` declares (devices,
// dtypes, head dims, page sizes). `g` must be non-null.
void check_geometry(const sieve_policy_descriptor& d, const sieve_geometry& g, Reasons& reasons);

// Rows of a selection for the call's query layout (attention.h): Σ_b ceil(n_b / q_block) × H,
// where n_b comes from qo_indptr_host and H = rows per (sequence, query block). Throws
// INVALID_ARGUMENT on a malformed qo_indptr_host.
int64_t selection_rows(const sieve_layer_call& call, int32_t q_block, int32_t rows_per_block);

// Throw unless `sel` can take `n_rows` rows and `nnz` entries on `device`: int32 1-D contiguous
// indptr with >= n_rows + 1 entries and indices with >= capacity entries (INVALID_ARGUMENT),
// both on `device` (INVALID_ARGUMENT), nnz <= capacity (CAPACITY). Checks before the policy
// writes anything, so a failed select leaves the chain's selection as it was.
void check_selection_storage(const sieve_selection& sel, int64_t n_rows, int64_t nnz,
                             DLDevice device);

// The host's core attention kernel (s.kernels->attend) on `args` as given. Throws the kernel's
// status with `what` and the host's message; UNSUPPORTED when the host offers no kernel, or when
// args carry a variant (ABI 1.1) and the host's kernels do not list SIEVE_VARIANT_KEY_SPANS.
void host_kernel_attend(const sieve_host_services& s, const sieve_attention_args& args, std::string_view what);

// Tokens resident for sequence b of a view, from its host mirrors.
inline int64_t view_tokens(const sieve_paged_kv& v, int32_t b) {
  const int32_t pages = v.indptr_host[b + 1] - v.indptr_host[b];
  return pages == 0 ? 0 : int64_t(pages - 1) * v.page_size + v.last_page_len_host[b];
}

const char* device_type_name(int32_t device_type) noexcept;

}  // namespace sieve::plugin
