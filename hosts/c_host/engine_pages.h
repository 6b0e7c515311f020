/* A host that keeps its own paged KV cache, as vLLM or SGLang do: one K and one V pool per layer
 * (f32 pages, HND or NHD), pages handed out from a shuffled free list, per-sequence page lists,
 * FlashInfer CSR tables built per call, and the page release sink Sieve sends evicted pages to.
 * c_host runs a chain over it through the host API 1.1 (the engine_pool store, bind_pages) and
 * checks that it gives what the same chain gives over the core store. */
#ifndef SIEVE_C_HOST_ENGINE_PAGES_H
#define SIEVE_C_HOST_ENGINE_PAGES_H

#include <sieve/host.h>

typedef struct engine_pages engine_pages;

/* A fresh engine for `g` (its layers, KV heads, head dim, page size, max_batch): `pool_pages`
 * pages per layer in `layout` (SIEVE_KV_LAYOUT_HND or SIEVE_KV_LAYOUT_NHD), shuffled by `seed`.
 * NULL when out of memory or for another layout. */
engine_pages* engine_pages_create(const sieve_geometry* g, int32_t pool_pages, uint32_t layout, unsigned seed);
void engine_pages_destroy(engine_pages* e);
/* Where the session sends the pages it evicts (options.release). */
sieve_page_release_sink engine_pages_sink(engine_pages* e);
/* The engine's part of one layer call: sequence b (Sieve id seq_ids[b]) grows by
 * qo[b + 1] - qo[b] tokens, whose K/V rows (k, v: [qo[batch]][n_kv_heads][head_dim]) the engine
 * writes into its pool itself; then it binds its pool and table of that layer to `session`.
 * Returns the status of sieve_session_bind_pages, or SIEVE_ERR_CAPACITY when its pool is full
 * (the reason then in engine_pages_last_error). */
sieve_status engine_pages_step(engine_pages* e, sieve_session* session, int32_t layer, const int32_t* seq_ids,
                               int32_t batch, const int32_t* qo, const float* k, const float* v);
/* Binds the layer's table as it stands with one page id replaced by one past the pool: what a
 * buggy engine would send. Sieve must refuse it. */
sieve_status engine_pages_bind_bad_page(engine_pages* e, sieve_session* session, int32_t layer);
/* Pages Sieve has given back so far, and pages it gave back that the sequence did not hold. */
int engine_pages_released(const engine_pages* e);
int engine_pages_bad_releases(const engine_pages* e);
/* Tokens the engine holds for sequence slot b in `layer` (after pages came back). */
int32_t engine_pages_tokens(const engine_pages* e, int32_t layer, int32_t b);
const char* engine_pages_last_error(const engine_pages* e);

#endif
