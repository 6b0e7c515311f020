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
  sieve_geometry geometry;  /* n_layers, n_kv_heads, head_dim, page_size, kv_dtype, device */
  int32_t pages_per_layer;  /* page pool capacity of each layer */
  int32_t keep_pre_rope_k;  /* 1: also store pre-RoPE keys (SeerAttention-R needs them) */
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
} sieve_kv_store_api;

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_KV_STORE_H */
