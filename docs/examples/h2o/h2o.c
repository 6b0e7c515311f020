/* h2o: Heavy-Hitter Oracle KV eviction (Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient
 * Generative Inference of Large Language Models", 2023), at page granularity, as an out-of-tree
 * Sieve policy written against the installed ABI headers alone (docs/plugin-authoring.md).
 *
 * Each decode step, the core attention kernel reports per page the attention mass the page
 * received (SIEVE_STATS_PAGE_MASS_ALL_HEADS: Σ over its tokens of the max over query heads of the
 * softmax probability). The policy accumulates that mass per (layer, sequence, page); at the end
 * of the step it keeps at most `budget_pages` pages per sequence and layer: the `recent_pages`
 * newest always, and among the older ones those with the largest accumulated mass (the heavy
 * hitters). The rest are evicted from the KV store: their memory is freed and later steps never
 * see them. Attention itself stays the core's dense kernel over what is resident.
 *
 * Hooks: select (asks for the statistics; keeps the selection), observe (accumulates),
 * end_step (evicts). CPU only: observe reads the statistics on the host.
 *
 * Deviations from the paper: pages instead of tokens (the store evicts pages); decode only (v1
 * emits statistics in decode only, so the prompt is scored from the first decode step on); the
 * max over heads instead of one cache per head (a page is shared by the heads of a layer). */
#include <sieve/sieve.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- Descriptor and parameters ------------------------------------------------------------ */

static const sieve_policy_descriptor kDescriptor = {
    SIEVE_HEADER_INIT(sieve_policy_descriptor),
    "h2o",                 /* name: [a-z0-9_]+, what a chain spec says */
    "example",             /* vendor */
    1, 0, 0,               /* the plugin's own version */
    "H2O: keep heavy-hitter + recent KV pages within a budget, evict the rest",
    SIEVE_PHASE_DECODE,
    SIEVE_DEVICE_CPU,
    SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16, /* it never reads K/V itself */
    NULL, 0,               /* any head dim */
    NULL, 0,               /* any page size */
    SIEVE_SEL_PER_SEQUENCE,
    SIEVE_NEEDS_PAGE_STATS,
    1,                     /* evicts KV in end_step */
    SIEVE_CUDA_GRAPH_NONE};

#define PARAM(name, type, def, lo, hi, doc) \
  {SIEVE_HEADER_INIT(sieve_param_spec), name, type, def, lo, hi, NULL, doc}
static const sieve_param_spec kParams[] = {
    PARAM("budget_pages", SIEVE_PARAM_INT, "64", 2, 1 << 24, "KV pages kept per sequence and layer"),
    PARAM("recent_pages", SIEVE_PARAM_INT, "4", 1, 1 << 24, "newest pages always kept (the last one included)"),
};
enum { P_BUDGET, P_RECENT, N_PARAMS };

/* ---- The instance ------------------------------------------------------------------------- */

struct sieve_policy {
  const sieve_host_services* services;
  int32_t n_layers, max_batch, max_pages;
  int32_t budget, recent;
  /* One slot per sequence in flight: the store's id, and when it was last seen. */
  int32_t* slot_seq;   /* [max_batch], -1: free */
  uint64_t* slot_seen; /* [max_batch] */
  uint64_t clock;
  /* Accumulated mass and tracked page count per (layer, slot). */
  float* score;        /* [n_layers][max_batch][max_pages] */
  int32_t* n_pages;    /* [n_layers][max_batch] */
  /* end_step scratch, sized here so no hook allocates. */
  int32_t* evict_list; /* [max_pages] */
  unsigned char* gone; /* [max_pages] */
  char error[256];
};

static void say(sieve_reason_sink sink, const char* fmt, ...) {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (sink.reason) sink.reason(sink.ctx, line);
}

/* A hook's failure: the message stays in the instance for last_error(). */
static sieve_status hook_error(sieve_policy* p, sieve_status st, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->error, sizeof p->error, fmt, ap);
  va_end(ap);
  return st;
}

/* Every reason this geometry / these values cannot run, through `reasons`. */
static sieve_status h2o_validate(const sieve_geometry* g, const sieve_param_value* v, uint32_t n,
                                 sieve_reason_sink reasons) {
  int bad = 0;
  if (!g) {
    say(reasons, "h2o: geometry is NULL");
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  if (n != N_PARAMS || !v) {
    say(reasons, "h2o: expected %d parameter values, got %u", N_PARAMS, n);
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  if (g->head_dim <= 0) bad = 1, say(reasons, "h2o: head_dim %d must be > 0", g->head_dim);
  if (g->page_size <= 0) bad = 1, say(reasons, "h2o: page_size %d must be > 0", g->page_size);
  if (g->n_q_heads <= 0 || g->n_kv_heads <= 0 || g->n_q_heads % g->n_kv_heads != 0)
    bad = 1, say(reasons, "h2o: %d query heads cannot be grouped over %d KV heads", g->n_q_heads, g->n_kv_heads);
  if (g->n_layers <= 0 || g->max_batch <= 0 || g->max_seq_len <= 0)
    bad = 1, say(reasons, "h2o: n_layers, max_batch and max_seq_len must be > 0");
  if (g->device.device_type != kDLCPU)
    bad = 1, say(reasons, "h2o: device type %d is not supported (CPU only)", (int)g->device.device_type);
  if (v[P_RECENT].i >= v[P_BUDGET].i)
    bad = 1, say(reasons, "h2o: recent_pages = %lld must be < budget_pages = %lld", (long long)v[P_RECENT].i,
                 (long long)v[P_BUDGET].i);
  return bad ? SIEVE_ERR_INVALID_ARGUMENT : SIEVE_OK;
}

static void h2o_destroy(sieve_policy* p) {
  const DLDevice cpu = {kDLCPU, 0};
  if (!p) return;
  /* Whoever allocates frees: everything came from the host's allocator. */
  p->services->free(p->services->host_ctx, cpu, p->slot_seq);
  p->services->free(p->services->host_ctx, cpu, p->slot_seen);
  p->services->free(p->services->host_ctx, cpu, p->score);
  p->services->free(p->services->host_ctx, cpu, p->n_pages);
  p->services->free(p->services->host_ctx, cpu, p->evict_list);
  p->services->free(p->services->host_ctx, cpu, p->gone);
  p->services->free(p->services->host_ctx, cpu, p);
}

/* Setup: the only place that allocates. */
static sieve_status h2o_create(const sieve_host_services* s, const sieve_geometry* g,
                               const sieve_param_value* v, uint32_t n, sieve_kv_store* kv,
                               const sieve_kv_store_api* kv_api, sieve_policy** out, sieve_reason_sink err) {
  const DLDevice cpu = {kDLCPU, 0};
  sieve_policy* p;
  size_t cells;
  int32_t i;
  (void)kv; /* eviction goes through the store handed to end_step */
  (void)kv_api;
  if (!out || !s || !s->alloc || !s->free) {
    say(err, "h2o: create needs host services and an out pointer");
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  *out = NULL;
  if (h2o_validate(g, v, n, err) != SIEVE_OK) return SIEVE_ERR_INVALID_ARGUMENT; /* reasons went to err */
  p = (sieve_policy*)s->alloc(s->host_ctx, cpu, sizeof *p, 16);
  if (!p) {
    say(err, "h2o: out of host memory");
    return SIEVE_ERR_OUT_OF_MEMORY;
  }
  memset(p, 0, sizeof *p);
  p->services = s;
  p->n_layers = g->n_layers;
  p->max_batch = g->max_batch;
  p->max_pages = (g->max_seq_len + g->page_size - 1) / g->page_size + 1;
  p->budget = (int32_t)v[P_BUDGET].i;
  p->recent = (int32_t)v[P_RECENT].i;
  cells = (size_t)p->n_layers * (size_t)p->max_batch;
  p->slot_seq = (int32_t*)s->alloc(s->host_ctx, cpu, sizeof(int32_t) * (size_t)p->max_batch, 16);
  p->slot_seen = (uint64_t*)s->alloc(s->host_ctx, cpu, sizeof(uint64_t) * (size_t)p->max_batch, 16);
  p->score = (float*)s->alloc(s->host_ctx, cpu, sizeof(float) * cells * (size_t)p->max_pages, 64);
  p->n_pages = (int32_t*)s->alloc(s->host_ctx, cpu, sizeof(int32_t) * cells, 16);
  p->evict_list = (int32_t*)s->alloc(s->host_ctx, cpu, sizeof(int32_t) * (size_t)p->max_pages, 16);
  p->gone = (unsigned char*)s->alloc(s->host_ctx, cpu, (size_t)p->max_pages, 16);
  if (!p->slot_seq || !p->slot_seen || !p->score || !p->n_pages || !p->evict_list || !p->gone) {
    h2o_destroy(p);
    say(err, "h2o: out of host memory for %d layers x %d sequences x %d pages", g->n_layers, g->max_batch,
        g->max_seq_len / g->page_size + 1);
    return SIEVE_ERR_OUT_OF_MEMORY;
  }
  for (i = 0; i < p->max_batch; ++i) p->slot_seq[i] = -1, p->slot_seen[i] = 0;
  memset(p->n_pages, 0, sizeof(int32_t) * cells);
  *out = p;
  return SIEVE_OK;
}

static const char* h2o_last_error(const sieve_policy* p) { return p ? p->error : "no instance"; }

/* The slot of a sequence; a new one takes a free slot or the least recently seen (its scores are
 * reset: sequence ids are the store's and may be reused after a sequence is removed). */
static int32_t slot_of(sieve_policy* p, int32_t seq, int create) {
  int32_t i, pick = -1;
  for (i = 0; i < p->max_batch; ++i)
    if (p->slot_seq[i] == seq) return i;
  if (!create) return -1;
  for (i = 0; i < p->max_batch; ++i)
    if (pick < 0 || p->slot_seq[i] < 0 || p->slot_seen[i] < p->slot_seen[pick]) {
      pick = i;
      if (p->slot_seq[i] < 0) break;
    }
  p->slot_seq[pick] = seq;
  for (i = 0; i < p->n_layers; ++i) p->n_pages[(size_t)i * (size_t)p->max_batch + (size_t)pick] = 0;
  return pick;
}

static float* scores(sieve_policy* p, int32_t layer, int32_t slot) {
  return p->score + ((size_t)layer * (size_t)p->max_batch + (size_t)slot) * (size_t)p->max_pages;
}

/* ---- Hooks -------------------------------------------------------------------------------- */

/* Asks the core kernel for page statistics; the selection stays what the chain made it. */
static sieve_status h2o_select(sieve_policy* p, const sieve_layer_call* call, sieve_selection* selection,
                               uint32_t* stats) {
  if (!p) return SIEVE_ERR_INVALID_ARGUMENT;
  if (!call || !selection || !stats) return hook_error(p, SIEVE_ERR_INVALID_ARGUMENT, "select: call, selection or stats is NULL");
  *stats = call->phase == SIEVE_PHASE_DECODE ? SIEVE_STATS_PAGE_MASS_ALL_HEADS : SIEVE_STATS_NONE;
  return SIEVE_OK;
}

/* Accumulates each page's attention mass. page_mass rows follow the view's page table. */
static sieve_status h2o_observe(sieve_policy* p, const sieve_layer_call* call, const sieve_attention_stats* st) {
  const sieve_paged_kv* view;
  const float* mass;
  int32_t b, j;
  if (!p) return SIEVE_ERR_INVALID_ARGUMENT;
  if (!call || !st) return hook_error(p, SIEVE_ERR_INVALID_ARGUMENT, "observe: call or stats is NULL");
  view = call->kv_view;
  if (!view || !view->indptr_host || !call->seq_ids)
    return hook_error(p, SIEVE_ERR_INVALID_ARGUMENT, "observe: the call has no KV view, page table or seq_ids");
  if (st->request != SIEVE_STATS_PAGE_MASS_ALL_HEADS || !st->page_mass.data)
    return hook_error(p, SIEVE_ERR_INVALID_ARGUMENT, "observe: expected page_mass for all heads, got request %u",
                      st->request);
  if (st->page_mass.device.device_type != kDLCPU)
    return hook_error(p, SIEVE_ERR_UNSUPPORTED, "observe: page_mass is not in host memory (CPU only)");
  if (call->layer < 0 || call->layer >= p->n_layers || call->batch < 0 || call->batch > p->max_batch)
    return hook_error(p, SIEVE_ERR_INVALID_ARGUMENT, "observe: layer %d / batch %d outside the geometry",
                      call->layer, call->batch);
  mass = (const float*)st->page_mass.data;
  ++p->clock;
  for (b = 0; b < call->batch; ++b) {
    const int32_t first = view->indptr_host[b], n = view->indptr_host[b + 1] - first;
    const int32_t slot = slot_of(p, call->seq_ids[b], 1);
    int32_t* tracked = &p->n_pages[(size_t)call->layer * (size_t)p->max_batch + (size_t)slot];
    float* s = scores(p, call->layer, slot);
    if (n > p->max_pages)
      return hook_error(p, SIEVE_ERR_CAPACITY, "observe: sequence %d has %d pages, max_seq_len allows %d",
                        call->seq_ids[b], n, p->max_pages);
    if (n < *tracked) *tracked = 0; /* fewer pages than we know of: a new sequence under that id */
    for (j = *tracked; j < n; ++j) s[j] = 0.f;
    *tracked = n;
    for (j = 0; j < n; ++j) s[j] += mass[first + j];
    p->slot_seen[slot] = p->clock;
  }
  return SIEVE_OK;
}

/* Evicts, per sequence and layer served, the lightest older pages beyond the budget. */
static sieve_status h2o_end_step(sieve_policy* p, const sieve_step_end* step) {
  int32_t b, li, j, k;
  if (!p) return SIEVE_ERR_INVALID_ARGUMENT;
  if (!step) return hook_error(p, SIEVE_ERR_INVALID_ARGUMENT, "end_step: step is NULL");
  if (step->phase != SIEVE_PHASE_DECODE) return SIEVE_OK;
  if (step->batch > 0 && (!step->seq_ids || !step->kv || !step->kv_api || !step->kv_api->evict))
    return hook_error(p, SIEVE_ERR_INVALID_ARGUMENT, "end_step: seq_ids or the KV store is missing");
  for (b = 0; b < step->batch; ++b) {
    const int32_t slot = slot_of(p, step->seq_ids[b], 0);
    if (slot < 0) continue; /* never observed: nothing to rank */
    for (li = 0; li < step->n_layers; ++li) {
      const int32_t layer = step->layers[li];
      int32_t* tracked;
      int32_t n, older, excess, kept;
      float* s;
      uint64_t freed = 0;
      sieve_status st;
      if (layer < 0 || layer >= p->n_layers) continue;
      tracked = &p->n_pages[(size_t)layer * (size_t)p->max_batch + (size_t)slot];
      n = *tracked;
      if (n <= p->budget) continue;
      s = scores(p, layer, slot);
      older = n - p->recent; /* candidates: [0, older) */
      excess = n - p->budget;
      memset(p->gone, 0, (size_t)n);
      /* The `excess` lightest candidates; ties evict the older page. */
      for (k = 0; k < excess; ++k) {
        int32_t worst = -1;
        for (j = 0; j < older; ++j)
          if (!p->gone[j] && (worst < 0 || s[j] < s[worst])) worst = j;
        p->gone[worst] = 1;
      }
      for (j = 0, k = 0; j < n; ++j)
        if (p->gone[j]) p->evict_list[k++] = j;
      st = step->kv_api->evict(step->kv, layer, step->seq_ids[b], p->evict_list, k, &freed);
      if (st != SIEVE_OK)
        return hook_error(p, st, "end_step: evicting %d pages of sequence %d, layer %d: %s", k, step->seq_ids[b],
                          layer, step->kv_api->last_error ? step->kv_api->last_error(step->kv) : "");
      /* Later pages shift down in the store; the scores follow. */
      for (j = 0, kept = 0; j < n; ++j)
        if (!p->gone[j]) s[kept++] = s[j];
      *tracked = kept;
      if (p->services->metric) p->services->metric(p->services->host_ctx, "h2o_evicted_pages", layer, -1, (double)k);
    }
  }
  return SIEVE_OK;
}

/* ---- Tables and the entry point ----------------------------------------------------------- */

static const sieve_policy_api kPolicy = {
    SIEVE_HEADER_INIT(sieve_policy_api),
    &kDescriptor,
    kParams,
    N_PARAMS,
    h2o_validate,
    h2o_create,
    h2o_destroy,
    h2o_last_error,
    NULL,         /* on_append */
    h2o_select,   /* select: asks for statistics */
    NULL,         /* attend: the core kernel */
    h2o_observe,  /* observe: accumulate */
    NULL,         /* correct */
    h2o_end_step, /* end_step: evict */
};

static const sieve_plugin kPlugin = {SIEVE_HEADER_INIT(sieve_plugin), SIEVE_ABI_MAJOR, "h2o", &kPolicy, NULL, NULL, 0};

/* Major negotiation: always say which major this is; serve any host that speaks it. */
SIEVE_EXPORT sieve_status sieve_plugin_entry(uint32_t host_major, uint32_t* plugin_major, const sieve_plugin** table) {
  if (plugin_major) *plugin_major = SIEVE_ABI_MAJOR;
  if (!table) return SIEVE_ERR_INVALID_ARGUMENT;
  if (host_major < SIEVE_ABI_MAJOR) {
    *table = NULL;
    return SIEVE_ERR_VERSION;
  }
  *table = &kPlugin;
  return SIEVE_OK;
}
