/* Sieve ABI v1 — the KV-store interface.
 *
 * A KV store keeps, per layer, a paged K/V cache for a set of sequences (FlashInfer layout):
 *   k_pages, v_pages : [page_capacity, n_kv_heads, page_size, head_dim]   ("HND" pages)
 *   page table (CSR over the sequences of one call):
 *     indptr        int32 [batch + 1]   pages of sequence b are indices[indptr[b] .. indptr[b+1])
 *     indices       int32 [nnz]         physical page ids, in token order
 *     last_page_len int32 [batch]       valid tokens in the last page (1..page_size)
 * The core ships a paged CPU store and a paged CUDA store behind this table; a plugin may ship
 * another (e.g. an offloading store) by filling `kv_store` in its plugin table.
 *
 * Logical page index: the position of a page in its sequence's page list (0 .. n_pages-1).
 * Selections and evictions speak logical indices; the page table maps them to physical ids.
 * Eviction removes pages from the list (later pages shift down) and returns their memory.
 */
#ifndef SIEVE_KV_STORE_H
#define SIEVE_KV_STORE_H

#include "sieve/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sieve_kv_store sieve_kv_store; /* opaque instance */
struct sieve_host_services;
struct sieve_param_spec;
struct sieve_param_value;

/* ---- ABI 1.1: what a store is and can do (descriptor), and engine-owned pages --------------- */

/* Physical layouts of a page pool. A view's k_pages / v_pages are always *shaped*
 * [page_capacity, n_kv_heads, page_size, head_dim]; a layout other than compact HND is expressed
 * by the DLTensor's strides (in elements; head_dim stride 1 always) and byte_offset:
 *   HND       strides NULL or [H*P*D, P*D, D, 1]   (FlashInfer "HND", the core stores)
 *   NHD       strides [P*H*D, D, H*D, 1]           (FlashInfer / vLLM "NHD")
 *   combined  one [num_pages, 2, ...] tensor (vLLM's FlashInfer backend): K and V views share its
 *             data pointer, the page stride is doubled and V's byte_offset is one K page.
 * A 1.0 consumer reads compact HND only, so the runtime hands a strided view only to chains whose
 * plugins declare the layouts they read (sieve_policy_descriptor.kv_layouts). */
typedef enum sieve_kv_layout_bits {
  SIEVE_KV_LAYOUT_HND = 1u << 0,
  SIEVE_KV_LAYOUT_NHD = 1u << 1,
  SIEVE_KV_LAYOUT_COMBINED = 1u << 2 /* K and V interleaved per page ([num_pages, 2, ...]) */
} sieve_kv_layout_bits;

/* What a store implements beyond append/view. A policy that needs a feature a store lacks is
 * refused when the session is created, naming both and the feature. */
typedef enum sieve_kv_feature_bits {
  SIEVE_KV_FEATURE_SIDECARS = 1u << 0,   /* register_sidecar / sidecar */
  SIEVE_KV_FEATURE_EVICTION = 1u << 1,   /* evict returns pages (to its pool or to the engine) */
  SIEVE_KV_FEATURE_PRE_ROPE_K = 1u << 2, /* keeps pre-RoPE keys (kv_config.keep_pre_rope_k) */
  SIEVE_KV_FEATURE_ENGINE_PAGES = 1u << 3 /* the host owns the page pool and the page tables and
                                             binds them per call (bind_pages); Sieve copies nothing */
} sieve_kv_feature_bits;

typedef struct sieve_kv_store_descriptor {
  sieve_header hdr;
  const char* name;    /* [a-z0-9_]+, unique among stores: "paged", "engine_pool" */
  const char* vendor;
  uint32_t version_major, version_minor, version_patch;
  const char* summary; /* one line */
  uint32_t devices;    /* sieve_device_bits */
  uint32_t dtypes;     /* sieve_dtype_bits of K/V storage */
  const int32_t* page_sizes; uint32_t n_page_sizes; /* n == 0: any */
  uint32_t layouts;    /* sieve_kv_layout_bits of the views it hands out */
  uint32_t features;   /* sieve_kv_feature_bits */
} sieve_kv_store_descriptor;

/* Where a store that does not own its pool sends pages it evicts (ENGINE_PAGES stores): the
 * physical page ids of the host's pool that `seq_id` no longer uses in `layer`. The host frees
 * them in its own allocator; they are never touched by Sieve again. Called from evict. */
typedef struct sieve_page_release_sink {
  void* ctx;
  void (*release)(void* ctx, int32_t layer, int32_t seq_id, const int32_t* physical_pages,
                  int32_t n);
} sieve_page_release_sink;

/* The host's pages of one layer for the sequences of one call (ENGINE_PAGES stores). Borrowed:
 * valid until the next bind_pages of that layer or the end of the step, whichever comes first.
 * The page table is FlashInfer's CSR, in the sequences' token order; the pool is shaped per
 * `layout`: HND [num_pages, n_kv_heads, page_size, head_dim], NHD [num_pages, page_size,
 * n_kv_heads, head_dim], COMBINED: k_pool [num_pages, 2, page_size, n_kv_heads, head_dim] (NHD
 * inside) or [num_pages, 2, n_kv_heads, page_size, head_dim] (HND inside, `combined_hnd` = 1)
 * with v_pool.data == NULL. */
typedef struct sieve_kv_pages {
  sieve_header hdr;
  int32_t layer;
  int32_t batch;
  const int32_t* seq_ids;            /* host [batch]: the store's sequence ids */
  uint32_t layout;                   /* one sieve_kv_layout_bits value */
  int32_t combined_hnd;              /* COMBINED only: 1 = HND inside each half */
  DLTensor k_pool;
  DLTensor v_pool;
  DLTensor indptr;                   /* int32 [batch + 1] on the pool's device */
  DLTensor indices;                  /* int32 [nnz] physical page ids */
  DLTensor last_page_len;            /* int32 [batch] */
  const int32_t* indptr_host;        /* [batch + 1] */
  const int32_t* last_page_len_host; /* [batch] */
  /* 1: the host already wrote this call's new tokens into the pool (vLLM's reshape_and_cache);
   * the next append only updates Sieve's bookkeeping and sidecars. 0: append writes them into the
   * last slots of each sequence's pages as the page table names them. */
  int32_t new_tokens_written;
  /* Host mirror of `indices` [nnz] (appended after the 1.1 design: the store checks the ids,
   * keeps each sequence's page list for evict and the release sink, and picks the pages whose
   * sidecars to zero, all on the host, without a device round trip). Required when the
   * pool is not on the CPU; NULL on the CPU means indices.data. */
  const int32_t* indices_host;
} sieve_kv_pages;

/* A borrowed, read-only view of one layer's paged cache for the sequences of one call.
 * Every DLTensor here lives on the store's device. The `*_host` arrays are host mirrors of the
 * small page-table arrays so a caller can size work without a device round trip. */
typedef struct sieve_paged_kv {
  sieve_header hdr;
  int32_t batch;
  int32_t page_size;
  DLTensor k_pages;        /* [page_capacity, n_kv_heads, page_size, head_dim] */
  DLTensor v_pages;        /* same shape as k_pages */
  DLTensor indptr;         /* int32 [batch + 1] */
  DLTensor indices;        /* int32 [nnz] physical page ids */
  DLTensor last_page_len;  /* int32 [batch] */
  const int32_t* indptr_host;        /* [batch + 1] */
  const int32_t* last_page_len_host; /* [batch] */
  DLTensor k_pre_rope_pages; /* same shape as k_pages; data == NULL unless the store keeps them */
} sieve_paged_kv;

/* Tokens appended to one layer: a ragged batch (CSR over sequences), post-RoPE K and V. */
typedef struct sieve_kv_append {
  sieve_header hdr;
  int32_t layer;
  int32_t batch;
  const int32_t* seq_ids;      /* host [batch] */
  const int32_t* token_indptr; /* host [batch + 1]: rows of k/v that belong to sequence b */
  const DLTensor* k;           /* [n_tokens, n_kv_heads, head_dim] post-RoPE, any float dtype */
  const DLTensor* v;           /* [n_tokens, n_kv_heads, head_dim] */
  const DLTensor* k_pre_rope;  /* optional, NULL: pre-RoPE keys (kept only if configured) */
} sieve_kv_append;

/* Store configuration. */
typedef struct sieve_kv_config {
  sieve_header hdr;
  sieve_geometry_v1_0 geometry; /* n_layers, n_kv_heads, head_dim, page_size, kv_dtype, device */
  int32_t pages_per_layer;  /* page pool capacity of each layer (ENGINE_PAGES: of the host's pool,
                               which sizes the sidecars Sieve keeps for it) */
  int32_t keep_pre_rope_k;  /* 1: also store pre-RoPE keys (SeerAttention-R needs them) */
  /* ---- ABI 1.1 ---- */
  const sieve_geometry* geometry_ref;       /* the full geometry (NULL: use `geometry`) */
  const struct sieve_param_value* params;   /* the store's schema-validated values, schema order */
  uint32_t n_params;
  sieve_page_release_sink release;          /* ENGINE_PAGES: where evicted pages go */
} sieve_kv_config;

/* A per-page metadata slot a policy registers (Quest min/max, Seer compressed K, timestamps).
 * Storage: one tensor per layer, [page_capacity, n_kv_heads, elems_per_head] of `dtype`, on the
 * store's device, indexed by physical page id, zero-initialised when a page is (re)allocated. */
typedef struct sieve_sidecar_desc {
  sieve_header hdr;
  const char* name;        /* unique per store, e.g. "quest.minmax" */
  DLDataType dtype;
  int32_t elems_per_head;  /* e.g. 2 * head_dim for min and max */
} sieve_sidecar_desc;

typedef struct sieve_kv_store_api {
  sieve_header hdr;
  const char* name; /* e.g. "paged-cpu" */

  sieve_status (*create)(const struct sieve_host_services* services, const sieve_kv_config* config,
                         sieve_kv_store** out, sieve_reason_sink err);
  void (*destroy)(sieve_kv_store* store);
  const char* (*last_error)(const sieve_kv_store* store);

  /* Sequences. Ids are chosen by the store. */
  sieve_status (*add_sequence)(sieve_kv_store* store, int32_t* seq_id);
  sieve_status (*remove_sequence)(sieve_kv_store* store, int32_t seq_id); /* frees all its pages */
  /* Tokens of sequence `seq_id` resident in `layer` (after evictions). */
  sieve_status (*seq_len)(const sieve_kv_store* store, int32_t layer, int32_t seq_id, int32_t* len);

  sieve_status (*append)(sieve_kv_store* store, const sieve_kv_append* a);

  /* View of one layer for the listed sequences (order of seq_ids = batch order). Valid until the
   * next append/evict/remove on the store. */
  sieve_status (*view)(sieve_kv_store* store, int32_t layer, const int32_t* seq_ids, int32_t batch,
                       sieve_paged_kv* out);

  /* Sidecars: register once at setup (returns a slot), then read/write the per-layer tensor. */
  sieve_status (*register_sidecar)(sieve_kv_store* store, const sieve_sidecar_desc* desc,
                                   int32_t* slot);
  sieve_status (*sidecar)(sieve_kv_store* store, int32_t layer, int32_t slot, DLTensor* out);

  /* Evict pages (logical indices, any order, no duplicates) of one sequence in one layer.
   * The last page of a sequence cannot be evicted (appends continue there). */
  sieve_status (*evict)(sieve_kv_store* store, int32_t layer, int32_t seq_id,
                        const int32_t* logical_pages, int32_t n, uint64_t* freed_bytes);

  /* Bytes of K/V (and pre-RoPE K, sidecars) held by resident pages, over all layers. */
  sieve_status (*bytes_in_use)(const sieve_kv_store* store, uint64_t* bytes);

  /* ---- ABI 1.1 (read only when SIEVE_HAS_FIELD says the table has them) ---- */
  const sieve_kv_store_descriptor* descriptor; /* NULL: a 1.0 store (features from the NULL-ness
                                                  of register_sidecar / evict, HND only) */
  const struct sieve_param_spec* params;       /* schema, as a policy's (walked by struct_size) */
  uint32_t n_params;
  /* Can a store be made for this config and these values? Every reason through `reasons`;
   * never touches a device. NULL: create decides. */
  sieve_status (*validate)(const sieve_kv_config* config, sieve_reason_sink reasons);
  /* ENGINE_PAGES: borrow the host's pages of one layer for the call that follows (append, view,
   * evict of that layer read them). Checks the ids (docs/abi.md says when); never copies K/V. */
  sieve_status (*bind_pages)(sieve_kv_store* store, const sieve_kv_pages* pages);
} sieve_kv_store_api;

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_KV_STORE_H */
