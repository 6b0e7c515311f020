/* The ABI headers are plain C11: this translation unit is compiled as C with -pedantic -Werror.
 * It also builds every table a plugin author fills, so a header that stops being valid C, or a
 * struct that loses its {struct_size, version} header, fails the build. */
#include "sieve/sieve.h"

#include <stddef.h>

_Static_assert(offsetof(sieve_geometry, hdr) == 0, "geometry starts with its header");
_Static_assert(offsetof(sieve_kv_store_api, hdr) == 0, "kv store table starts with its header");
_Static_assert(offsetof(sieve_policy_api, hdr) == 0, "policy table starts with its header");
_Static_assert(offsetof(sieve_plugin, hdr) == 0, "plugin table starts with its header");
_Static_assert(offsetof(sieve_host_services, hdr) == 0, "services start with their header");
_Static_assert(offsetof(sieve_attention_args, hdr) == 0, "attention args start with a header");
_Static_assert(offsetof(sieve_selection, hdr) == 0, "selection starts with its header");
_Static_assert(sizeof(sieve_header) == 8, "header is two uint32");

static sieve_status entry(uint32_t host_major, uint32_t* plugin_major, const sieve_plugin** t) {
  static const sieve_plugin table = {SIEVE_HEADER_INIT(sieve_plugin), SIEVE_ABI_MAJOR, "c_only", 0, 0, 0, 0};
  *plugin_major = SIEVE_ABI_MAJOR;
  *t = host_major >= SIEVE_ABI_MAJOR ? &table : 0;
  return host_major >= SIEVE_ABI_MAJOR ? SIEVE_OK : SIEVE_ERR_VERSION;
}

/* Called from the C++ test. */
int sieve_abi_c_check(void) {
  sieve_plugin_entry_fn fn = entry;
  uint32_t major = 0;
  const sieve_plugin* t = 0;
  sieve_geometry g = {SIEVE_HEADER_INIT(sieve_geometry), 0, 0, 0, 0, 0, 0, 0, {0, 0, 0}, {kDLCPU, 0}, 0.f, 0};
  if (fn(SIEVE_ABI_MAJOR, &major, &t) != SIEVE_OK || !t || major != SIEVE_ABI_MAJOR) return 1;
  if (fn(0, &major, &t) != SIEVE_ERR_VERSION || t) return 2;
  if (!SIEVE_HAS_FIELD(&g, sieve_geometry, rope_dim)) return 3;
  g.hdr.struct_size = (uint32_t)offsetof(sieve_geometry, rope_theta);
  if (SIEVE_HAS_FIELD(&g, sieve_geometry, rope_dim)) return 4; /* an older, shorter struct */
  return 0;
}
