/* Sieve host API v1 — embed the Sieve runtime from C (or from Rust, Python ctypes, Go cgo ...).
 *
 * Beside the plugin ABI (sieve.h): plugins implement those tables; a host engine calls these
 * functions, exported by the runtime library (libsieve_runtime.so; CMake: Sieve::runtime,
 * pkg-config: sieve-runtime). Plain C11, no C++ type crosses.
 *
 * What a host does, in order:
 *   sieve_runtime_create        one runtime: a plugin registry (discovery as `sieve plugins`)
 *   sieve_runtime_add_plugin_dir  extra plugin directories (searched first, in the order added)
 *   sieve_runtime_plugin_count / _plugin_info   what was found (no GPU needed)
 *   sieve_chain_parse / sieve_chain_load_file   a chain spec (docs/chains.md grammar)
 *   sieve_session_create        KV stores + the chain's policy instances for one model geometry
 *   sieve_session_add_sequence  per request
 *   sieve_session_attend        per layer and step: append the new K/V, run the chain, write out
 *   sieve_session_end_step      after every layer of a step ran (policies may evict KV here)
 *
 * Conventions (the same as the plugin ABI, abi.h):
 *  - Every function that can fail returns a sieve_status; the message is read with the
 *    *_last_error function of the object it was called on (sieve_runtime_last_error for the
 *    create functions). Nothing throws, nothing aborts on bad input.
 *  - Opaque handles. Structs a caller fills or receives start with a sieve_header: set it with
 *    SIEVE_HEADER_INIT(type). The runtime reads / writes only the fields the caller's struct_size
 *    covers, so a host compiled against an older minor keeps working with a newer runtime.
 *  - Ownership: the caller owns every tensor and array it passes; they are borrowed for the
 *    duration of the call. Strings and structs the runtime returns are owned by the object they
 *    came from and stay valid until it is destroyed (a last_error text: until the next call on
 *    that object). Whoever creates an object destroys it; destroy functions accept NULL.
 *  - Lifetimes are independent: a chain may be destroyed right after the sessions made from it
 *    are created, and a session keeps its plugins loaded after its runtime is destroyed.
 *  - Threads: one object is used by one thread at a time; different sessions may run on different
 *    threads concurrently.
 *  - Tensors are DLPack DLTensors (dtype, shape, device; compact row-major, strides NULL or
 *    matching) on the session's device; CUDA work is enqueued on the session's stream
 *    (sieve_session_cuda_stream), and the host synchronises with sieve_session_synchronize.
 */
#ifndef SIEVE_HOST_H
#define SIEVE_HOST_H

#include "sieve/abi.h"
#include "sieve/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SIEVE_HOST_API_MAJOR 1u
#define SIEVE_HOST_API_MINOR 2u

#if defined(_WIN32)
#define SIEVE_HOST_API __declspec(dllimport)
#else
#define SIEVE_HOST_API __attribute__((visibility("default")))
#endif

typedef struct sieve_runtime sieve_runtime; /* plugin registry */
typedef struct sieve_chain sieve_chain;     /* a parsed chain spec */
typedef struct sieve_session sieve_session; /* KV stores + policy instances for one geometry */

/* (SIEVE_HOST_API_MAJOR << 16) | SIEVE_HOST_API_MINOR of the library actually loaded: a host
 * checks the major before anything else. */
SIEVE_HOST_API uint32_t sieve_host_api_version(void);

/* ---- Runtime and plugins ----------------------------------------------------------------- */
typedef enum sieve_runtime_flags {
  SIEVE_RUNTIME_NO_ENV = 1u << 0,          /* ignore SIEVE_PLUGIN_PATH */
  SIEVE_RUNTIME_NO_DEFAULT_DIRS = 1u << 1, /* only directories added with add_plugin_dir */
  /* Host API 1.2: load plugin files directly, without first loading each in a forked probe
   * process. For multithreaded hosts (Python with torch, CUDA initialised), where a forked child
   * may call only async-signal-safe functions until it execs, so a probe's dlopen can hang or
   * die silently. A plugin that crashes while loading then takes the host with it. */
  SIEVE_RUNTIME_NO_PROBE = 1u << 2
} sieve_runtime_flags;

typedef struct sieve_runtime_options {
  sieve_header hdr;
  uint32_t flags; /* sieve_runtime_flags */
} sieve_runtime_options;

/* `options` may be NULL (defaults: the search path of docs: --plugin-dir, SIEVE_PLUGIN_PATH,
 * next to the executable, next to this library, the install libdir). Plugins are loaded on the
 * first call that needs them (plugin_count, plugin_info, session_create). On failure *out is NULL
 * and the status says why (the text is lost: there is no object to hold it). */
SIEVE_HOST_API sieve_status sieve_runtime_create(const sieve_runtime_options* options,
                                                 sieve_runtime** out);
SIEVE_HOST_API void sieve_runtime_destroy(sieve_runtime* runtime);
/* The message of the last failed call on this runtime ("" if none). */
SIEVE_HOST_API const char* sieve_runtime_last_error(const sieve_runtime* runtime);

/* A plugin directory. Before plugins are loaded: searched before every default, in the order
 * added. After: loaded at once, after what is already there (the first plugin of a name wins).
 * A directory that does not exist is SIEVE_ERR_NOT_FOUND. */
SIEVE_HOST_API sieve_status sieve_runtime_add_plugin_dir(sieve_runtime* runtime, const char* dir);

/* Usable plugins, in search order. */
SIEVE_HOST_API sieve_status sieve_runtime_plugin_count(sieve_runtime* runtime, uint32_t* count);

typedef struct sieve_plugin_info {
  sieve_header hdr;
  const char* name;
  const char* path;      /* the file it came from */
  uint32_t abi_major;    /* negotiated */
  uint32_t abi_minor;    /* the minor the plugin table was compiled against */
  const sieve_policy_descriptor* descriptor; /* NULL when the plugin ships no policy */
  const sieve_param_spec* params;            /* schema, n_params entries of params_stride bytes */
  uint32_t n_params;
  uint32_t params_stride;
  /* ---- host API 1.1 ---- */
  const sieve_kv_store_descriptor* kv_store_descriptor; /* NULL when it ships no KV store (or a
                                                           1.0 store without a descriptor) */
  const sieve_param_spec* kv_store_params;              /* the store's schema */
  uint32_t n_kv_store_params;
  uint32_t kv_store_params_stride;
  const sieve_tool* tools;                              /* tools it ships (plugin.h) */
  uint32_t n_tools;
  uint32_t builtin;                                     /* 1: the runtime's own (core stores) */
} sieve_plugin_info;

/* Fills *info (caller sets info->hdr with SIEVE_HEADER_INIT(sieve_plugin_info)). The pointers
 * point into the plugin and stay valid while the runtime or a session made from it lives. */
SIEVE_HOST_API sieve_status sieve_runtime_plugin_info(sieve_runtime* runtime, uint32_t index,
                                                      sieve_plugin_info* info);

/* Files that were found but not loaded (one line each: the file, then the reason). */
SIEVE_HOST_API sieve_status sieve_runtime_failure_count(sieve_runtime* runtime, uint32_t* count);
SIEVE_HOST_API const char* sieve_runtime_failure(sieve_runtime* runtime, uint32_t index);

/* ---- Chains ------------------------------------------------------------------------------ */
/* The compact form ("decode:*=quest(token_budget=256)") or a chain file (docs/chains.md). Only
 * the syntax is checked here; plugins, parameters and geometry are checked by session_create. */
SIEVE_HOST_API sieve_status sieve_chain_parse(sieve_runtime* runtime, const char* spec,
                                              sieve_chain** out);
SIEVE_HOST_API sieve_status sieve_chain_load_file(sieve_runtime* runtime, const char* path,
                                                  sieve_chain** out);
SIEVE_HOST_API void sieve_chain_destroy(sieve_chain* chain);
/* The chain written back in compact form, normalised. */
SIEVE_HOST_API const char* sieve_chain_text(const sieve_chain* chain);

/* ---- Sessions: a model's KV cache and its chains ----------------------------------------- */
typedef struct sieve_session_options {
  sieve_header hdr;
  int32_t pages_per_layer; /* page pool of each layer; 0: max_batch x ceil(max_seq_len / page) */
  int32_t check;           /* 1: check every selection and output (NaN/Inf, page ranges) and name
                              the plugin, layer and hook that broke them; 0: trust the plugins */
  /* ---- host API 1.1: which KV store (at most one of the three; all NULL: the chain's `kv_store`
   * line if it has one, else the core's "paged" store) ---- */
  const char* kv_store;    /* a store by name with parameters, "engine_pool(layout=nhd)" */
  /* A store table the host brings (not a plugin). With kv_store_instance NULL the session creates
   * the instance from it and destroys it; with an instance the host created, the session borrows
   * it (the host destroys it after the session) and it must match the geometry. */
  const sieve_kv_store_api* kv_store_api;
  sieve_kv_store* kv_store_instance;
  sieve_page_release_sink release; /* ENGINE_PAGES stores: where evicted pages go */
  /* ---- host API 1.2 ---- */
  /* CUDA sessions: a cudaStream_t the host owns (e.g. PyTorch's current stream). The session
   * enqueues all its work there for its whole life (sieve_session_cuda_stream returns it), so the
   * host's own kernels and the session's are ordered without events; the host keeps it alive
   * until sieve_session_destroy returned. NULL: the session creates its own non-blocking stream.
   * A CPU session refuses one. A host checks sieve_host_api_version() >= 1.2 first: an older
   * runtime ignores the field. */
  void* cuda_stream;
} sieve_session_options;

/* Sets up the KV store (the core's paged store on geometry->device) and every policy instance of
 * `chain` (NULL: dense attention in every layer) for `geometry`. Every problem found (unknown
 * plugin, bad parameter, a geometry a plugin refuses, no CUDA device ...) is in the runtime's
 * last_error, one per line. */
SIEVE_HOST_API sieve_status sieve_session_create(sieve_runtime* runtime,
                                                 const sieve_geometry* geometry,
                                                 const sieve_chain* chain,
                                                 const sieve_session_options* options,
                                                 sieve_session** out);
SIEVE_HOST_API void sieve_session_destroy(sieve_session* session);
SIEVE_HOST_API const char* sieve_session_last_error(const sieve_session* session);

/* Sequences (requests). Ids are chosen by the session. Removing frees every page it holds. */
SIEVE_HOST_API sieve_status sieve_session_add_sequence(sieve_session* session, int32_t* seq_id);
SIEVE_HOST_API sieve_status sieve_session_remove_sequence(sieve_session* session, int32_t seq_id);
/* Tokens of a sequence resident in a layer (after any eviction). */
SIEVE_HOST_API sieve_status sieve_session_seq_len(sieve_session* session, int32_t layer,
                                                  int32_t seq_id, int32_t* tokens);

/* One layer's new tokens for a batch of sequences. */
typedef struct sieve_layer_inputs {
  sieve_header hdr;
  int32_t layer;
  uint32_t phase;            /* SIEVE_PHASE_PREFILL (causal) or SIEVE_PHASE_DECODE (1 token each) */
  int32_t batch;
  const int32_t* seq_ids;    /* host [batch] */
  const int32_t* qo_indptr;  /* host [batch + 1]: rows of q/k/v/out of sequence b */
  const int32_t* positions;  /* host [n_new] absolute positions; NULL: right after the tokens
                                this session already took for the sequence in this layer */
  const DLTensor* q;         /* [n_new, n_q_heads, head_dim] post-RoPE */
  const DLTensor* k;         /* [n_new, n_kv_heads, head_dim] post-RoPE */
  const DLTensor* v;         /* [n_new, n_kv_heads, head_dim] */
  const DLTensor* q_pre_rope; /* NULL, or as q before RoPE (policies that need it) */
  const DLTensor* k_pre_rope; /* NULL, or as k before RoPE */
} sieve_layer_inputs;

/* Appends k/v to the layer's cache, runs the layer's chain for `phase` and writes the attention
 * output to `out` ([n_new, n_q_heads, head_dim], f32/f16/bf16, on the session's device). */
SIEVE_HOST_API sieve_status sieve_session_attend(sieve_session* session,
                                                 const sieve_layer_inputs* inputs, DLTensor* out);
/* Every layer of the step ran for these sequences: policies do cross-layer work (eviction). */
SIEVE_HOST_API sieve_status sieve_session_end_step(sieve_session* session, uint32_t phase,
                                                   const int32_t* seq_ids, int32_t batch);
/* Waits for the device work enqueued so far (no-op on the CPU). */
SIEVE_HOST_API sieve_status sieve_session_synchronize(sieve_session* session);
/* The cudaStream_t the session enqueues on (its own, or options.cuda_stream; NULL on the CPU). */
SIEVE_HOST_API void* sieve_session_cuda_stream(sieve_session* session);
/* Host API 1.1. ENGINE_PAGES stores: the host's page pool and page table of one layer for the
 * call that follows (sieve_session_attend of that layer). Borrowed until that call returns. */
SIEVE_HOST_API sieve_status sieve_session_bind_pages(sieve_session* session,
                                                     const sieve_kv_pages* pages);
/* Host API 1.1. The store the session runs on (name as its descriptor says; "" for a 1.0 store). */
SIEVE_HOST_API const char* sieve_session_kv_store_name(const sieve_session* session);

/* K/V (and sidecar) bytes resident over all layers. */
SIEVE_HOST_API sieve_status sieve_session_kv_bytes(sieve_session* session, uint64_t* bytes);

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_HOST_H */
