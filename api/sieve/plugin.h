/* Sieve ABI v1 — the one exported entry point of a plugin and the table it hands back.
 *
 * A plugin .so exports exactly:
 *   sieve_plugin_entry   (required)  major-version negotiation + the plugin table
 *   sieve_plugin_score   (optional)  how well this build suits the machine, to pick between a
 *                                    CPU-only and a CUDA build of the same plugin
 * Everything else is reached through the tables; every other symbol is hidden.
 */
#ifndef SIEVE_PLUGIN_H
#define SIEVE_PLUGIN_H

#include "sieve/policy.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SIEVE_PLUGIN_ENTRY_SYMBOL "sieve_plugin_entry"
#define SIEVE_PLUGIN_SCORE_SYMBOL "sieve_plugin_score"

/* A command-line tool a plugin ships with its method (ABI 1.1): calibration, gate distillation,
 * diagnostics. `sieve tool <plugin> <name> ARGS...` (and the CLI's own aliases, e.g. `sieve
 * calibrate dpxa`) run it in the CLI's process, so a third party's method ships its tools the
 * same way the bundled ones do. `run` parses its own arguments, prints to stdout/stderr, and
 * returns the process exit status (0 success; bad input: one line on stderr and non-zero). */
typedef struct sieve_tool {
  sieve_header hdr;
  const char* name;    /* [a-z0-9_-]+, unique within the plugin: "calibrate", "distill-gate" */
  const char* summary; /* one line, for `sieve plugins` and `sieve tool --help` */
  int32_t (*run)(int32_t argc, const char* const* argv); /* argv[0] = "sieve tool <plugin> <name>" */
} sieve_tool;

typedef struct sieve_plugin {
  sieve_header hdr;
  uint32_t abi_major;                 /* the major this table is for */
  const char* name;                   /* == descriptor name for a policy plugin */
  const sieve_policy_api* policy;     /* NULL if the plugin ships no policy */
  const sieve_kv_store_api* kv_store; /* NULL if the plugin ships no KV store */
  /* ---- ABI 1.1 ---- */
  const sieve_tool* tools;            /* n_tools entries, walked by their struct_size */
  uint32_t n_tools;
} sieve_plugin;

/* Negotiation. The host passes the newest major it speaks; the plugin writes the major it
 * implements to *plugin_major (always, so the host can name both numbers) and, if it can serve
 * that host (its major <= host_major and it implements it), the table to *table and returns
 * SIEVE_OK; otherwise SIEVE_ERR_VERSION and *table = NULL. Must not allocate or touch a device. */
typedef sieve_status (*sieve_plugin_entry_fn)(uint32_t host_major, uint32_t* plugin_major,
                                              const sieve_plugin** table);

/* Optional: > 0 usable (higher is better), 0 usable as a fallback, < 0 unusable here
 * (e.g. a CUDA-only build on a machine without a GPU). Must not fail or crash without a GPU. */
typedef int32_t (*sieve_plugin_score_fn)(void);

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_PLUGIN_H */
