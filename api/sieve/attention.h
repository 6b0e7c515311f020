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

/* ABI 1.1 — an attention variant: the core kernel with its key list and logits transformed, so a
 * method that attends compressed keys (Delta-KV's packed anchors, DeltaX's packed tiles) is a
 * description of what to attend, not a second kernel (FlashInfer's attention variants, as data).
 *
 * Rows are numbered like a selection's (q_block, heads; see sieve_selection): the row of query
 * token i of sequence b and query head h is (C_b + i / q_block) * H + h', H = 1, n_kv_heads or
 * n_q_heads by `heads`, h' the row head of h. Row r attends the spans
 * [row_spans[r][0], row_spans[r][1]) of `spans` (rows may share or skip spans), each {kind, begin, end}:
 *   SIEVE_SPAN_KEYS    positions [begin, end) of the sequence, each key as it is;
 *   SIEVE_SPAN_PACKED  packed keys [begin, end) of packed_pos: packed key e is the key at position
 *                      packed_pos[e] of the sequence standing for count_e = packed_count[e] keys;
 * in one softmax. Causality holds for both: a query at position p sees key positions <= p. The
 * logit of key position k (KEYS) is scale·q·k_k; of packed key e (PACKED, packed_pos[e] = k <= p)
 *   scale·q·k_k + ln(min(count_e, p - k + 1)) + packed_bias[e]
 * (key-count weighting: a packed key never stands for keys past the query). A key listed twice
 * counts twice; a row with nothing visible outputs 0 (lse -inf). K and V of every key are read
 * from the view's pages (packed keys are not copied). With a variant the selection must be NULL
 * or ALL, q_rows NULL and stats NONE. Tensors live on the attention device. Offered when the host's sieve_kernels.variants has SIEVE_VARIANT_KEY_SPANS. */
typedef enum sieve_span_kind {
  SIEVE_SPAN_KEYS = 0,
  SIEVE_SPAN_PACKED = 1
} sieve_span_kind;

typedef enum sieve_variant_flags {
  /* The softmax weights stay f32 through P·V: no kernel rounds them to 16-bit MMA operands (the
   * CUDA tensor-core path then is not taken; a method whose error budget is f32's sets it). */
  SIEVE_VARIANT_F32_WEIGHTS = 1u << 0
} sieve_variant_flags;

typedef struct sieve_attention_variant {
  sieve_header hdr;
  uint32_t heads;        /* sieve_selection_heads of the rows */
  int32_t q_block;       /* query tokens per row block (>= 1) */
  int32_t n_rows;        /* Σ_b ceil(n_b / q_block) * H */
  DLTensor row_spans;    /* int32 [n_rows, 2]: each row's span range */
  DLTensor spans;        /* int32 [n_spans, 3]: {sieve_span_kind, begin, end} */
  DLTensor packed_pos;   /* int32 [n_packed]: the position each packed key is read at */
  DLTensor packed_count; /* int32 [n_packed] (>= 1), or data NULL: every count 1 */
  DLTensor packed_bias;  /* f32 [n_packed] natural-log logit bias, or data NULL: 0 */
  uint32_t flags;        /* sieve_variant_flags */
} sieve_attention_variant;

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
  /* ABI 1.1 (read when struct_size reaches it): */
  const sieve_attention_variant* variant; /* NULL: plain attention */
} sieve_attention_args;

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_ATTENTION_H */
