/* Sieve ABI v1 — selections and the core attention kernels' arguments.
 *
 * Query layout: q, out : [n_q_tokens, n_q_heads, head_dim] (ragged over sequences by qo_indptr).
 * The query tokens of sequence b are its last n_b = qo_indptr[b+1]-qo_indptr[b] tokens; query i
 * of b sits at position kv_len_b - n_b + i and (prefill, causal) sees keys 0 .. that position.
 * GQA: query head h reads KV head h / (n_q_heads / n_kv_heads).
 */
#ifndef SIEVE_ATTENTION_H
#define SIEVE_ATTENTION_H

#include "sieve/kv_store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a selection row is for. */
typedef enum sieve_selection_heads {
  SIEVE_SEL_PER_SEQUENCE = 0, /* one row per (sequence, query block), shared by every head */
  SIEVE_SEL_PER_KV_HEAD = 1,  /* one row per (sequence, query block, KV head): a GQA group shares */
  SIEVE_SEL_PER_Q_HEAD = 2    /* one row per (sequence, query block, query head) */
} sieve_selection_heads;

typedef enum sieve_selection_kind {
  SIEVE_SEL_ALL = 0,   /* dense: attend every resident key (the chain's starting state) */
  SIEVE_SEL_BLOCKS = 1 /* block-sparse: attend only the listed key blocks */
} sieve_selection_kind;

/* A selection: CSR lists of key blocks (logical, see kv_store.h), one list per row.
 *  - key block j of a sequence = logical pages [j*k_block_pages, (j+1)*k_block_pages), clipped;
 *  - rows: with Qb_b = ceil(n_b / q_block) query blocks for sequence b and C_b = Σ_{b'<b} Qb_b',
 *    the row of (sequence b, query block t, head h) is (C_b + t) * H + h, H = 1, n_kv_heads or
 *    n_q_heads by `heads`. Decode has n_b = 1, so its rows are simply b * H + h.
 *  - indices within a row are strictly increasing; each is < the sequence's key-block count.
 *  - causality still applies inside a selected block; an empty row attends nothing (output 0).
 * indptr/indices live on the attention device; the host owns them: indptr holds at least
 * n_q_tokens * n_q_heads + 1 entries (enough for any heads/q_block), indices `capacity` entries.
 * A policy whose lists do not fit returns SIEVE_ERR_CAPACITY (and should use larger blocks). */
typedef struct sieve_selection {
  sieve_header hdr;
  uint32_t kind;          /* sieve_selection_kind */
  uint32_t heads;         /* sieve_selection_heads */
  int32_t q_block;        /* query tokens per row block (prefill); 1 for decode */
  int32_t k_block_pages;  /* pages per key block (>= 1) */
  int32_t n_rows;
  DLTensor indptr;        /* int32 [n_rows + 1] */
  DLTensor indices;       /* int32 [capacity] */
  int64_t capacity;       /* entries indices can hold */
} sieve_selection;

/* Page statistics a policy may ask the attention pass to emit (decode only in v1). */
typedef enum sieve_stats_request {
  SIEVE_STATS_NONE = 0,
  SIEVE_STATS_PAGE_MASS_PER_KV_HEAD = 1, /* page_mass [nnz, n_kv_heads]: Σ_t max_{h in group} p_h(t) */
  SIEVE_STATS_PAGE_MASS_ALL_HEADS = 2    /* page_mass [nnz, 1]: Σ_t max over all q heads p_h(t) */
} sieve_stats_request;

/* Attention statistics delivered to `observe`. */
typedef struct sieve_attention_stats {
  sieve_header hdr;
  uint32_t request;    /* sieve_stats_request that produced them */
  DLTensor page_mass;  /* f32 [nnz pages of the view, H], aligned with the page table; pages the
                          selection skipped hold 0 */
  DLTensor lse;        /* f32 [n_q_tokens, n_q_heads]: natural-log sum of exp(scaled logits) */
} sieve_attention_stats;

/* One call of the core kernel: dense or block-sparse paged attention, decode or causal prefill,
 * optionally only for a subset of query rows, optionally emitting statistics. The device is the
 * device of the tensors (CPU or CUDA); a CUDA call is enqueued on the host's stream. */
typedef struct sieve_attention_args {
  sieve_header hdr;
  uint32_t phase;             /* SIEVE_PHASE_PREFILL (causal) or SIEVE_PHASE_DECODE */
  int32_t n_q_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  float scale;                /* logit scale; 0 means 1/sqrt(head_dim) */
  const DLTensor* q;          /* [n_q_tokens, n_q_heads, head_dim] f32/f16/bf16 */
  DLTensor* out;              /* same shape; f32/f16/bf16; rows not computed are left untouched */
  const DLTensor* qo_indptr;  /* int32 [batch + 1] on the attention device */
  const int32_t* qo_indptr_host; /* host mirror of qo_indptr */
  const sieve_paged_kv* kv;
  const sieve_selection* selection; /* NULL or kind == ALL: dense */
  const DLTensor* q_rows;     /* NULL: all rows; else int32 [m] query token indices to compute */
  uint32_t stats;             /* sieve_stats_request */
  DLTensor* lse;              /* optional f32 [n_q_tokens, n_q_heads] */
  DLTensor* page_mass;        /* required when stats != NONE, see sieve_attention_stats */
} sieve_attention_args;

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_ATTENTION_H */
