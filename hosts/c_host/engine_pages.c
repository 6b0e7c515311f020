/* The host's own paged KV cache (engine_pages.h). */
#include "engine_pages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct engine_pages {
  int32_t layers, hkv, dim, page, batch, pool;
  uint32_t layout;
  float *k, *v;       /* [layers][pool] pages of hkv x page x dim floats, in `layout` order */
  int32_t* free_list; /* [layers][pool], n_free[layer] of them valid */
  int32_t* n_free;
  int32_t* seq_id;  /* [batch]: Sieve's id of each slot */
  int32_t* pages;   /* [layers][batch][pool]: physical ids in token order */
  int32_t* n_pages; /* [layers][batch] */
  int32_t* tokens;  /* [layers][batch] */
  /* The table of the last bind of each layer (borrowed by Sieve until the layer's next bind). */
  int32_t *indptr, *indices, *last; /* [layers][batch + 1], [layers][pool], [layers][batch] */
  int64_t pool_shape[4], *table_shapes; /* [layers][3]: indptr, indices, last_page_len */
  int released, bad_releases;
  char error[160];
};

static DLTensor view(void* data, DLDataType dt, int ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

void engine_pages_destroy(engine_pages* e) {
  if (!e) return;
  free(e->k), free(e->v), free(e->free_list), free(e->n_free), free(e->seq_id), free(e->pages);
  free(e->n_pages), free(e->tokens), free(e->indptr), free(e->indices), free(e->last), free(e->table_shapes);
  free(e);
}

engine_pages* engine_pages_create(const sieve_geometry* g, int32_t pool_pages, uint32_t layout, unsigned seed) {
  engine_pages* e;
  size_t floats, L, B, N;
  int32_t l, i;
  if (layout != SIEVE_KV_LAYOUT_HND && layout != SIEVE_KV_LAYOUT_NHD) return NULL;
  if (!(e = (engine_pages*)calloc(1, sizeof *e))) return NULL;
  e->layers = g->n_layers, e->hkv = g->n_kv_heads, e->dim = g->head_dim, e->page = g->page_size;
  e->batch = g->max_batch, e->pool = pool_pages, e->layout = layout;
  L = (size_t)e->layers, B = (size_t)e->batch, N = (size_t)pool_pages;
  floats = L * N * (size_t)e->hkv * (size_t)e->page * (size_t)e->dim;
  e->k = (float*)calloc(floats, sizeof(float));
  e->v = (float*)calloc(floats, sizeof(float));
  e->free_list = (int32_t*)calloc(L * N, sizeof(int32_t));
  e->n_free = (int32_t*)calloc(L, sizeof(int32_t));
  e->seq_id = (int32_t*)calloc(B, sizeof(int32_t));
  e->pages = (int32_t*)calloc(L * B * N, sizeof(int32_t));
  e->n_pages = (int32_t*)calloc(L * B, sizeof(int32_t));
  e->tokens = (int32_t*)calloc(L * B, sizeof(int32_t));
  e->indptr = (int32_t*)calloc(L * (B + 1), sizeof(int32_t));
  e->indices = (int32_t*)calloc(L * N, sizeof(int32_t));
  e->last = (int32_t*)calloc(L * B, sizeof(int32_t));
  e->table_shapes = (int64_t*)calloc(L * 3, sizeof(int64_t));
  if (!e->k || !e->v || !e->free_list || !e->n_free || !e->seq_id || !e->pages || !e->n_pages || !e->tokens ||
      !e->indptr || !e->indices || !e->last || !e->table_shapes) {
    engine_pages_destroy(e);
    return NULL;
  }
  for (l = 0; l < e->layers; ++l) {
    int32_t* fl = e->free_list + (size_t)l * N;
    for (i = 0; i < pool_pages; ++i) fl[i] = i;
    for (i = pool_pages - 1; i > 0; --i) { /* shuffled: physical order never matches token order */
      int32_t j, t;
      seed = seed * 1103515245u + 12345u;
      j = (int32_t)((seed >> 8) % (unsigned)(i + 1));
      t = fl[i], fl[i] = fl[j], fl[j] = t;
    }
    e->n_free[l] = pool_pages;
  }
  e->pool_shape[0] = pool_pages;
  e->pool_shape[1] = layout == SIEVE_KV_LAYOUT_HND ? e->hkv : e->page;
  e->pool_shape[2] = layout == SIEVE_KV_LAYOUT_HND ? e->page : e->hkv;
  e->pool_shape[3] = e->dim;
  return e;
}

/* Float offset of (layer, page, kv head, slot) in a pool. */
static size_t at(const engine_pages* e, int32_t layer, int32_t page, int32_t h, int32_t slot) {
  const size_t p = (size_t)layer * (size_t)e->pool + (size_t)page;
  const size_t in_page = e->layout == SIEVE_KV_LAYOUT_HND ? (size_t)h * (size_t)e->page + (size_t)slot
                                                          : (size_t)slot * (size_t)e->hkv + (size_t)h;
  return (p * (size_t)e->hkv * (size_t)e->page + in_page) * (size_t)e->dim;
}

static int32_t* seq_pages(engine_pages* e, int32_t layer, int32_t b) {
  return e->pages + ((size_t)layer * (size_t)e->batch + (size_t)b) * (size_t)e->pool;
}

/* Sieve evicted `pages` of sequence `seq` in `layer`: they leave its list and are free again. */
static void release(void* ctx, int32_t layer, int32_t seq, const int32_t* pages, int32_t n) {
  engine_pages* e = (engine_pages*)ctx;
  int32_t b, i, j;
  for (b = 0; b < e->batch && e->seq_id[b] != seq; ++b) {
  }
  if (b == e->batch || layer < 0 || layer >= e->layers) {
    e->bad_releases += n;
    return;
  }
  for (i = 0; i < n; ++i) {
    int32_t* list = seq_pages(e, layer, b);
    int32_t* count = &e->n_pages[(size_t)layer * (size_t)e->batch + (size_t)b];
    for (j = 0; j < *count && list[j] != pages[i]; ++j) {
    }
    if (j == *count) {
      ++e->bad_releases;
      continue;
    }
    memmove(&list[j], &list[j + 1], sizeof(int32_t) * (size_t)(*count - j - 1));
    --*count;
    e->tokens[(size_t)layer * (size_t)e->batch + (size_t)b] -= e->page; /* never the last page */
    e->free_list[(size_t)layer * (size_t)e->pool + (size_t)e->n_free[layer]++] = pages[i];
    ++e->released;
  }
}

sieve_page_release_sink engine_pages_sink(engine_pages* e) {
  sieve_page_release_sink s;
  s.ctx = e;
  s.release = release;
  return s;
}

int engine_pages_released(const engine_pages* e) { return e->released; }
int engine_pages_bad_releases(const engine_pages* e) { return e->bad_releases; }
int32_t engine_pages_tokens(const engine_pages* e, int32_t layer, int32_t b) {
  return e->tokens[(size_t)layer * (size_t)e->batch + (size_t)b];
}
const char* engine_pages_last_error(const engine_pages* e) { return e->error; }

/* The layer's CSR table from the page lists as they stand (last page lengths from the tokens). */
static void build_table(engine_pages* e, int32_t layer, int32_t batch) {
  int32_t* indptr = e->indptr + (size_t)layer * (size_t)(e->batch + 1);
  int32_t* indices = e->indices + (size_t)layer * (size_t)e->pool;
  int32_t* last = e->last + (size_t)layer * (size_t)e->batch;
  int64_t* shapes = e->table_shapes + (size_t)layer * 3;
  int32_t b;
  indptr[0] = 0;
  for (b = 0; b < batch; ++b) {
    const size_t lb = (size_t)layer * (size_t)e->batch + (size_t)b;
    memcpy(&indices[indptr[b]], seq_pages(e, layer, b), sizeof(int32_t) * (size_t)e->n_pages[lb]);
    indptr[b + 1] = indptr[b] + e->n_pages[lb];
    last[b] = e->n_pages[lb] ? (e->tokens[lb] - 1) % e->page + 1 : 0;
  }
  shapes[0] = batch + 1, shapes[1] = indptr[batch], shapes[2] = batch;
}

static sieve_status bind(engine_pages* e, sieve_session* session, int32_t layer, int32_t batch) {
  const DLDataType f32 = {kDLFloat, 32, 1}, i32 = {kDLInt, 32, 1};
  const size_t layer_floats = (size_t)e->pool * (size_t)e->hkv * (size_t)e->page * (size_t)e->dim;
  int32_t* indptr = e->indptr + (size_t)layer * (size_t)(e->batch + 1);
  int32_t* indices = e->indices + (size_t)layer * (size_t)e->pool;
  int32_t* last = e->last + (size_t)layer * (size_t)e->batch;
  int64_t* shapes = e->table_shapes + (size_t)layer * 3;
  sieve_kv_pages p = {.hdr = SIEVE_HEADER_INIT(sieve_kv_pages)};
  p.layer = layer;
  p.batch = batch;
  p.seq_ids = e->seq_id;
  p.layout = e->layout;
  p.k_pool = view(e->k + (size_t)layer * layer_floats, f32, 4, e->pool_shape);
  p.v_pool = view(e->v + (size_t)layer * layer_floats, f32, 4, e->pool_shape);
  p.indptr = view(indptr, i32, 1, &shapes[0]);
  p.indices = view(indices, i32, 1, &shapes[1]);
  p.last_page_len = view(last, i32, 1, &shapes[2]);
  p.indptr_host = indptr;
  p.last_page_len_host = last;
  p.indices_host = indices;
  p.new_tokens_written = 1; /* the engine writes its cache itself (engine_pages_step) */
  return sieve_session_bind_pages(session, &p);
}

sieve_status engine_pages_step(engine_pages* e, sieve_session* session, int32_t layer, const int32_t* seq_ids,
                               int32_t batch, const int32_t* qo, const float* k, const float* v) {
  int32_t b, row, h;
  if (layer < 0 || layer >= e->layers || batch < 0 || batch > e->batch) {
    snprintf(e->error, sizeof e->error, "engine pages: layer %d or batch %d out of range", (int)layer, (int)batch);
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  for (b = 0; b < batch; ++b) {
    const size_t lb = (size_t)layer * (size_t)e->batch + (size_t)b;
    int32_t* list = seq_pages(e, layer, b);
    e->seq_id[b] = seq_ids[b];
    for (row = qo[b]; row < qo[b + 1]; ++row) {
      const int32_t t = e->tokens[lb];
      int32_t page;
      if (t % e->page == 0) {
        if (e->n_free[layer] == 0) {
          snprintf(e->error, sizeof e->error, "engine pages: the pool of layer %d (%d pages) is full", (int)layer,
                   (int)e->pool);
          return SIEVE_ERR_CAPACITY;
        }
        list[e->n_pages[lb]++] = e->free_list[(size_t)layer * (size_t)e->pool + (size_t)--e->n_free[layer]];
      }
      page = list[t / e->page];
      for (h = 0; h < e->hkv; ++h) {
        const size_t src = ((size_t)row * (size_t)e->hkv + (size_t)h) * (size_t)e->dim;
        memcpy(e->k + at(e, layer, page, h, t % e->page), k + src, sizeof(float) * (size_t)e->dim);
        memcpy(e->v + at(e, layer, page, h, t % e->page), v + src, sizeof(float) * (size_t)e->dim);
      }
      ++e->tokens[lb];
    }
  }
  build_table(e, layer, batch);
  return bind(e, session, layer, batch);
}

sieve_status engine_pages_bind_bad_page(engine_pages* e, sieve_session* session, int32_t layer) {
  build_table(e, layer, e->batch);
  if (e->table_shapes[(size_t)layer * 3 + 1] == 0) return SIEVE_ERR_INVALID_ARGUMENT; /* nothing to break */
  e->indices[(size_t)layer * (size_t)e->pool] = e->pool;
  return bind(e, session, layer, e->batch);
}
