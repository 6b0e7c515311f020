/* Sieve ABI v1 — the attention-policy interface: descriptor, parameter schema, hooks.
 *
 * For each layer and step the host calls a layer's chain (an ordered list of policy instances for
 * the phase) in this fixed order; a policy implements only the hooks it needs (NULL = not used):
 *   1. on_append  (every policy of the chain)  new K/V entered the store: maintain page sidecars
 *   2. select     (in chain order)             produce or refine the selection; ask for stats
 *   3. attend     (at most one per chain)      replace the core kernel; otherwise the core's
 *                                              dense / block-sparse kernel runs on the selection
 *   4. observe    (policies that asked)        receive the statistics of that attention pass
 *   5. correct    (in chain order)             post-process the output
 * and after every layer of a step has run:
 *   6. end_step   (each instance once)         cross-layer bookkeeping and KV eviction
 */
#ifndef SIEVE_POLICY_H
#define SIEVE_POLICY_H

#include "sieve/host_services.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sieve_policy sieve_policy; /* opaque instance */

/* ---- Parameters: a schema the host validates user config against ---------------------------- */
typedef enum sieve_param_type {
  SIEVE_PARAM_BOOL = 0,
  SIEVE_PARAM_INT = 1,      /* int64, [min, max] */
  SIEVE_PARAM_FLOAT = 2,    /* double, [min, max] */
  SIEVE_PARAM_STRING = 3,   /* free text (e.g. a file path) */
  SIEVE_PARAM_ENUM = 4,     /* one of `choices` ("a|b|c"); value.i is the index */
  SIEVE_PARAM_INT_LIST = 5  /* comma-separated int64 list, each in [min, max] */
} sieve_param_type;

typedef struct sieve_param_spec {
  sieve_header hdr;
  const char* name;          /* [a-z0-9_]+ */
  uint32_t type;             /* sieve_param_type */
  const char* default_value; /* as text, in the same syntax a user writes */
  double min, max;           /* INT, FLOAT, INT_LIST bounds (inclusive) */
  const char* choices;       /* ENUM only */
  const char* doc;           /* one line */
} sieve_param_spec;

/* Validated values, handed to validate/create in schema order, every parameter present
 * (defaults filled in). Strings and lists are borrowed for the duration of the call.
 * Frozen for major 1 (it carries no header, and arrays of it are walked by sizeof): a value of a
 * later parameter type is carried in these members (text in `s`, numbers in `list`). tests/abi/v1_0
 * pins its size and offsets. */
typedef struct sieve_param_value {
  uint32_t type;
  int64_t i;            /* BOOL (0/1), INT, ENUM index */
  double f;             /* FLOAT */
  const char* s;        /* STRING, ENUM (the choice's text) */
  const int64_t* list;  /* INT_LIST */
  uint32_t list_len;
} sieve_param_value;

/* ---- Capabilities: declared, not discovered by crashing ------------------------------------- */
typedef enum sieve_needs_bits {
  SIEVE_NEEDS_PAGE_STATS = 1u << 0,   /* asks for page statistics (observe) */
  SIEVE_NEEDS_PRE_ROPE_K = 1u << 1,   /* the store must keep pre-RoPE keys */
  SIEVE_NEEDS_PRE_ROPE_Q = 1u << 2,   /* the host passes pre-RoPE queries */
  SIEVE_NEEDS_WEIGHTS_FILE = 1u << 3, /* a parameter names a weights file */
  SIEVE_NEEDS_SIDECARS = 1u << 4      /* registers page sidecars in the store */
} sieve_needs_bits;

typedef enum sieve_cuda_graph_level {
  SIEVE_CUDA_GRAPH_NONE = 0,          /* hooks sync or vary launches: never capture */
  SIEVE_CUDA_GRAPH_STATIC_SHAPES = 1, /* capturable while batch and lengths are fixed */
  SIEVE_CUDA_GRAPH_FULL = 2           /* capturable across steps (device-side lengths only) */
} sieve_cuda_graph_level;

/* What a policy's selection is computed from (ABI 1.1, `selection_basis`). Conformance probes a
 * content-based selection with a planted workload it must find (docs/conformance.md). */
typedef enum sieve_selection_basis {
  SIEVE_SELECTION_BASIS_UNDECLARED = 0, /* a 1.0 plugin, or not said: probed, warned, not failed */
  SIEVE_SELECTION_BASIS_CONTENT = 1,    /* scores keys against queries: must find planted keys */
  SIEVE_SELECTION_BASIS_POSITIONAL = 2, /* content-blind by design (sinks + recent window) */
  SIEVE_SELECTION_BASIS_NONE = 3        /* never narrows the selection (dense, corrections) */
} sieve_selection_basis;

typedef struct sieve_policy_descriptor {
  sieve_header hdr;
  const char* name;      /* [a-z0-9_]+, unique among loaded plugins: "quest" */
  const char* vendor;    /* vendor prefix: "sieve" */
  uint32_t version_major, version_minor, version_patch; /* the plugin's own version */
  const char* summary;   /* one line */
  uint32_t phases;       /* sieve_phase bits */
  uint32_t devices;      /* sieve_device_bits */
  uint32_t dtypes;       /* sieve_dtype_bits of K/V storage */
  const int32_t* head_dims;  uint32_t n_head_dims;  /* n == 0: any */
  const int32_t* page_sizes; uint32_t n_page_sizes; /* n == 0: any */
  uint32_t selection_heads; /* sieve_selection_heads it produces (if it selects) */
  uint32_t needs;           /* sieve_needs_bits */
  uint32_t evicts_kv;       /* 1: end_step may evict pages */
  uint32_t cuda_graph;      /* sieve_cuda_graph_level */
  /* ---- ABI 1.1 (read only when SIEVE_HAS_FIELD says the plugin has them) ---- */
  /* Parameters `sieve conform` uses instead of the schema defaults, in a chain item's syntax
   * ("k=v,k=v", int lists in brackets): e.g. budgets small enough that the conformance contexts
   * reach the sparse path, a built-in gate instead of a weights file. NULL or "": defaults. */
  const char* conform_params;
  uint32_t selection_basis; /* sieve_selection_basis */
  /* sieve_kv_layout_bits of the store views every hook and CUDA/CPU path of this plugin reads
   * correctly (it honours the view tensors' strides and byte_offset). 0 (1.0): compact HND only. */
  uint32_t kv_layouts;
} sieve_policy_descriptor;

/* ---- Per-call context ------------------------------------------------------------------------ */
typedef struct sieve_layer_call {
  sieve_header hdr;
  int32_t layer;
  uint32_t phase;          /* SIEVE_PHASE_PREFILL or SIEVE_PHASE_DECODE */
  uint64_t step;           /* decode step counter of the run (0 during prefill) */
  int32_t batch;
  const int32_t* seq_ids;        /* host [batch]: the store's sequence ids */
  const DLTensor* qo_indptr;     /* int32 [batch + 1] on the attention device */
  const int32_t* qo_indptr_host; /* host mirror */
  const int32_t* kv_len_host;    /* host [batch]: resident tokens per sequence, new ones included */
  const DLTensor* q;             /* [n_q_tokens, n_q_heads, head_dim] post-RoPE */
  const DLTensor* q_pre_rope;    /* same shape, or NULL unless SIEVE_NEEDS_PRE_ROPE_Q */
  const int32_t* positions_host; /* host [n_q_tokens]: absolute position of each query token */
  const sieve_geometry* geometry;
  sieve_kv_store* kv;            /* the store and the layer's view (already appended) */
  const sieve_kv_store_api* kv_api;
  const sieve_paged_kv* kv_view;
} sieve_layer_call;

/* A step is over: every layer of the batch ran. */
typedef struct sieve_step_end {
  sieve_header hdr;
  uint32_t phase;
  uint64_t step;
  int32_t batch;
  const int32_t* seq_ids;     /* host [batch] */
  const int32_t* kv_len_host; /* host [batch] tokens per sequence (logical length, all layers) */
  const int32_t* layers;      /* host: the layers this instance served in the step */
  int32_t n_layers;
  sieve_kv_store* kv;
  const sieve_kv_store_api* kv_api;
} sieve_step_end;

/* Hooks one instance uses (ABI 1.1, sieve_policy_api.instance_hooks). */
typedef enum sieve_hook_bits {
  SIEVE_HOOK_ON_APPEND = 1u << 0,
  SIEVE_HOOK_SELECT = 1u << 1,
  SIEVE_HOOK_ATTEND = 1u << 2,
  SIEVE_HOOK_OBSERVE = 1u << 3,
  SIEVE_HOOK_CORRECT = 1u << 4,
  SIEVE_HOOK_END_STEP = 1u << 5
} sieve_hook_bits;

/* ---- The policy table ------------------------------------------------------------------------ */
typedef struct sieve_policy_api {
  sieve_header hdr;
  const sieve_policy_descriptor* descriptor;
  const sieve_param_spec* params;
  uint32_t n_params;

  /* Can an instance run on this geometry with these (schema-validated) values? Reports every
   * reason it cannot through `reasons` and returns SIEVE_ERR_INVALID_ARGUMENT or UNSUPPORTED;
   * SIEVE_OK with no reason when it can. Never touches a device. */
  sieve_status (*validate)(const sieve_geometry* geometry, const sieve_param_value* values,
                           uint32_t n_values, sieve_reason_sink reasons);

  /* Setup: allocate all scratch here (through services), register sidecars on `kv` if needed. */
  sieve_status (*create)(const sieve_host_services* services, const sieve_geometry* geometry,
                         const sieve_param_value* values, uint32_t n_values, sieve_kv_store* kv,
                         const sieve_kv_store_api* kv_api, sieve_policy** out,
                         sieve_reason_sink err);
  void (*destroy)(sieve_policy* policy);
  const char* (*last_error)(const sieve_policy* policy); /* message of the last failed hook */

  /* Hooks (see the order above). */
  sieve_status (*on_append)(sieve_policy* p, const sieve_layer_call* call, const sieve_kv_append* a);
  /* `selection` holds the chain's selection so far (kind ALL at the start); the policy may rewrite
   * it within its capacity. Set *stats to a sieve_stats_request to receive statistics. */
  sieve_status (*select)(sieve_policy* p, const sieve_layer_call* call, sieve_selection* selection,
                         uint32_t* stats);
  sieve_status (*attend)(sieve_policy* p, const sieve_layer_call* call,
                         const sieve_selection* selection, DLTensor* out);
  sieve_status (*observe)(sieve_policy* p, const sieve_layer_call* call,
                          const sieve_attention_stats* stats);
  /* `out` holds the attention output so far (O*), rewritten in place. */
  sieve_status (*correct)(sieve_policy* p, const sieve_layer_call* call,
                          const sieve_selection* selection, DLTensor* out);
  sieve_status (*end_step)(sieve_policy* p, const sieve_step_end* step);

  /* ---- ABI 1.1 ---- */
  /* The hooks this instance uses (sieve_hook_bits), asked once right after create: a subset of the
   * table's non-NULL hooks (the host refuses anything else). The host calls only these and
   * counts only these in chain checks (e.g. an instance whose parameters make it a selector does
   * not count as an attender). NULL: every non-NULL hook of the table. */
  uint32_t (*instance_hooks)(const sieve_policy* policy);
} sieve_policy_api;

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_POLICY_H */
