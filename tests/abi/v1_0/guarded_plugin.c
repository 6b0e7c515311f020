/* Fixture "v1_0_guarded": a plugin compiled against the FROZEN v1.0 headers (this directory comes
 * first on its include path), whose tables end exactly at a page boundary followed by a PROT_NONE
 * guard page. Any host read past a table's struct_size (a field a later minor appended, read
 * without SIEVE_HAS_FIELD) faults at once instead of reading garbage, so a runtime that loads,
 * conforms and runs this plugin provably reads nothing of its tables beyond v1.0. The tables are
 * also read-only, like the const tables of a real plugin.
 *
 * The policy keeps the chain's selection (dense stays dense), asks for page statistics in decode
 * and checks them in observe, so numeric conformance exercises select, observe and end_step. */
#define _DEFAULT_SOURCE 1 /* mmap flags under -std=c11 */
#include <sieve/sieve.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const sieve_policy_descriptor kDescriptorTemplate = {
    SIEVE_HEADER_INIT(sieve_policy_descriptor), "v1_0_guarded", "sieve_test", 1, 0, 0,
    "built against the frozen v1.0 headers; tables end at a guard page",
    SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE, SIEVE_DEVICE_CPU,
    SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16, NULL, 0, NULL, 0, SIEVE_SEL_PER_SEQUENCE,
    SIEVE_NEEDS_PAGE_STATS, 0, SIEVE_CUDA_GRAPH_FULL};

static const sieve_param_spec kParamsTemplate[] = {
    {SIEVE_HEADER_INIT(sieve_param_spec), "budget", SIEVE_PARAM_INT, "64", 1, 4096, NULL, "unused"},
    {SIEVE_HEADER_INIT(sieve_param_spec), "mode", SIEVE_PARAM_ENUM, "b", 0, 0, "a|b|c", "unused"},
};
#define N_PARAMS 2u

struct sieve_policy {
  const sieve_host_services* services;
  char error[160];
};

static void say(sieve_reason_sink sink, const char* fmt, ...) {
  char line[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (sink.reason) sink.reason(sink.ctx, line);
}

static sieve_status validate(const sieve_geometry* g, const sieve_param_value* v, uint32_t n,
                             sieve_reason_sink reasons) {
  int bad = 0;
  if (!g || n != N_PARAMS || !v) {
    say(reasons, "v1_0_guarded: geometry and %u values are required", N_PARAMS);
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  if (g->head_dim <= 0) bad = 1, say(reasons, "v1_0_guarded: head_dim %d must be > 0", g->head_dim);
  if (g->page_size <= 0) bad = 1, say(reasons, "v1_0_guarded: page_size %d must be > 0", g->page_size);
  if (g->n_q_heads <= 0 || g->n_kv_heads <= 0 || g->n_q_heads % g->n_kv_heads)
    bad = 1, say(reasons, "v1_0_guarded: %d query heads over %d KV heads", g->n_q_heads, g->n_kv_heads);
  if (g->device.device_type != kDLCPU) bad = 1, say(reasons, "v1_0_guarded: CPU only");
  return bad ? SIEVE_ERR_INVALID_ARGUMENT : SIEVE_OK;
}

static sieve_status create(const sieve_host_services* s, const sieve_geometry* g, const sieve_param_value* v,
                           uint32_t n, sieve_kv_store* kv, const sieve_kv_store_api* kv_api, sieve_policy** out,
                           sieve_reason_sink err) {
  DLDevice cpu = {kDLCPU, 0};
  sieve_policy* p;
  (void)kv;
  (void)kv_api;
  if (!out || !s || !s->alloc) {
    say(err, "v1_0_guarded: create needs services and out");
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  *out = NULL;
  if (validate(g, v, n, err) != SIEVE_OK) return SIEVE_ERR_INVALID_ARGUMENT;
  p = (sieve_policy*)s->alloc(s->host_ctx, cpu, sizeof *p, 16);
  if (!p) {
    say(err, "v1_0_guarded: out of memory");
    return SIEVE_ERR_OUT_OF_MEMORY;
  }
  memset(p, 0, sizeof *p);
  p->services = s;
  *out = p;
  return SIEVE_OK;
}

static void destroy(sieve_policy* p) {
  DLDevice cpu = {kDLCPU, 0};
  if (p) p->services->free(p->services->host_ctx, cpu, p);
}

static const char* last_error(const sieve_policy* p) { return p ? p->error : "no instance"; }

static sieve_status fail(sieve_policy* p, const char* what) {
  snprintf(p->error, sizeof p->error, "v1_0_guarded: %s", what);
  return SIEVE_ERR_INVALID_ARGUMENT;
}

static sieve_status select_hook(sieve_policy* p, const sieve_layer_call* call, sieve_selection* sel, uint32_t* stats) {
  if (!p) return SIEVE_ERR_INVALID_ARGUMENT;
  if (!call || !sel || !stats) return fail(p, "select: NULL argument");
  *stats = call->phase == SIEVE_PHASE_DECODE ? SIEVE_STATS_PAGE_MASS_PER_KV_HEAD : SIEVE_STATS_NONE;
  return SIEVE_OK;
}

static sieve_status observe(sieve_policy* p, const sieve_layer_call* call, const sieve_attention_stats* st) {
  if (!p) return SIEVE_ERR_INVALID_ARGUMENT;
  if (!call || !st) return fail(p, "observe: NULL argument");
  if (st->request != SIEVE_STATS_PAGE_MASS_PER_KV_HEAD || !st->page_mass.data) return fail(p, "observe: no page mass");
  return SIEVE_OK;
}

static sieve_status end_step(sieve_policy* p, const sieve_step_end* step) {
  if (!p) return SIEVE_ERR_INVALID_ARGUMENT;
  if (!step) return fail(p, "end_step: NULL step");
  return SIEVE_OK;
}

/* ---- Tables in guarded memory ---------------------------------------------------------------- */

/* `bytes` at the very end of a read-only page followed by an inaccessible one. */
static void* guarded_copy(const void* src, size_t bytes) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t span = (bytes + page - 1) / page * page;
  char* base = (char*)mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char* at;
  if (base == MAP_FAILED) return NULL;
  if (mprotect(base + span, page, PROT_NONE) != 0) return NULL;
  at = base + span - bytes;
  memcpy(at, src, bytes);
  return at;
}

static void seal(const void* at, size_t bytes) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t first = (uintptr_t)at / page * page, end = (uintptr_t)at + bytes;
  mprotect((void*)first, end - first, PROT_READ);
}

static const sieve_plugin* g_plugin;

__attribute__((constructor)) static void build_tables(void) {
  sieve_policy_descriptor* d = (sieve_policy_descriptor*)guarded_copy(&kDescriptorTemplate, sizeof kDescriptorTemplate);
  sieve_param_spec* params = (sieve_param_spec*)guarded_copy(kParamsTemplate, sizeof kParamsTemplate);
  sieve_policy_api api_template = {SIEVE_HEADER_INIT(sieve_policy_api), NULL, NULL, N_PARAMS, validate, create, destroy,
                                   last_error, NULL, select_hook, NULL, observe, NULL, end_step};
  sieve_plugin plugin_template = {SIEVE_HEADER_INIT(sieve_plugin), SIEVE_ABI_MAJOR, "v1_0_guarded", NULL, NULL};
  sieve_policy_api* api;
  sieve_plugin* plugin;
  if (!d || !params) return;
  api_template.descriptor = d;
  api_template.params = params;
  api = (sieve_policy_api*)guarded_copy(&api_template, sizeof api_template);
  if (!api) return;
  plugin_template.policy = api;
  plugin = (sieve_plugin*)guarded_copy(&plugin_template, sizeof plugin_template);
  if (!plugin) return;
  seal(d, sizeof *d);
  seal(params, sizeof kParamsTemplate);
  seal(api, sizeof *api);
  seal(plugin, sizeof *plugin);
  g_plugin = plugin;
}

SIEVE_EXPORT sieve_status sieve_plugin_entry(uint32_t host_major, uint32_t* plugin_major, const sieve_plugin** table) {
  if (plugin_major) *plugin_major = SIEVE_ABI_MAJOR;
  if (!table) return SIEVE_ERR_INVALID_ARGUMENT;
  *table = NULL;
  if (host_major < SIEVE_ABI_MAJOR) return SIEVE_ERR_VERSION;
  if (!g_plugin) return SIEVE_ERR_OUT_OF_MEMORY; /* the guarded tables could not be mapped */
  *table = g_plugin;
  return SIEVE_OK;
}
