/* Sieve ABI v1 — the common vocabulary of every table that crosses the plugin boundary.
 *
 * Plain C11. Nothing here is C++: no exception, std:: object or allocator ever crosses.
 * Versioning (docs/abi.md has the full rules):
 *  - MAJOR is negotiated once, at the entry point (Vulkan-style: the host offers the newest major it
 *    speaks, the plugin answers with the one it implements).
 *  - MINOR growth is append-only: every struct that crosses starts with {struct_size, version};
 *    fields are only ever added at the end; a reader checks struct_size before touching a field that
 *    a later minor added (SIEVE_HAS_FIELD). A NULL function pointer means "not supported".
 */
#ifndef SIEVE_ABI_H
#define SIEVE_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SIEVE_ABI_MAJOR 1u
#define SIEVE_ABI_MINOR 1u

/* Exported-symbol decoration for the one entry point of a plugin. */
#if defined(_WIN32)
#define SIEVE_EXPORT __declspec(dllexport)
#else
#define SIEVE_EXPORT __attribute__((visibility("default")))
#endif

/* Every struct that crosses the boundary starts with this header. */
typedef struct sieve_header {
  uint32_t struct_size; /* sizeof(the struct) as the producer compiled it */
  uint32_t version;     /* the minor version the producer compiled against */
} sieve_header;

#define SIEVE_HEADER_INIT(type) {(uint32_t)sizeof(type), SIEVE_ABI_MINOR}

/* True when a struct of `struct_size` bytes (from its header) contains `field` completely. */
#define SIEVE_HAS_FIELD(ptr, type, field) \
  ((ptr)->hdr.struct_size >= offsetof(type, field) + sizeof(((type*)0)->field))

/* Status codes. Every call that can fail returns one; the message is retrieved from the instance
 * (last_error) or was handed to a reason/err sink. Nothing throws across the boundary. */
typedef enum sieve_status {
  SIEVE_OK = 0,
  SIEVE_ERR_INVALID_ARGUMENT = 1, /* a tensor, geometry or parameter the callee cannot accept */
  SIEVE_ERR_UNSUPPORTED = 2,      /* a valid request this implementation does not do */
  SIEVE_ERR_VERSION = 3,          /* ABI major / struct version mismatch */
  SIEVE_ERR_OUT_OF_MEMORY = 4,
  SIEVE_ERR_CAPACITY = 5,         /* a fixed-size buffer (page pool, selection) is full */
  SIEVE_ERR_DEVICE = 6,           /* a CUDA (or other device) call failed */
  SIEVE_ERR_NOT_FOUND = 7,        /* unknown sequence, layer, sidecar slot ... */
  SIEVE_ERR_INTERNAL = 8
} sieve_status;

/* Attention phases. */
typedef enum sieve_phase {
  SIEVE_PHASE_PREFILL = 1u << 0, /* many new query tokens per sequence, causal */
  SIEVE_PHASE_DECODE = 1u << 1   /* one new query token per sequence */
} sieve_phase;

/* Device and dtype capability bits (DLPack identifies the concrete tensors). */
typedef enum sieve_device_bits {
  SIEVE_DEVICE_CPU = 1u << 0,
  SIEVE_DEVICE_CUDA = 1u << 1
} sieve_device_bits;

typedef enum sieve_dtype_bits {
  SIEVE_DTYPE_F32 = 1u << 0,
  SIEVE_DTYPE_F16 = 1u << 1,
  SIEVE_DTYPE_BF16 = 1u << 2
} sieve_dtype_bits;

/* Log levels of the host's log callback (the host routes them to spdlog). */
typedef enum sieve_log_level {
  SIEVE_LOG_TRACE = 0,
  SIEVE_LOG_DEBUG = 1,
  SIEVE_LOG_INFO = 2,
  SIEVE_LOG_WARN = 3,
  SIEVE_LOG_ERROR = 4
} sieve_log_level;

/* A sink for human-readable reasons (validate) or one error line (create). `ctx` is the caller's. */
typedef struct sieve_reason_sink {
  void* ctx;
  void (*reason)(void* ctx, const char* message);
} sieve_reason_sink;

/* Model/attention geometry a policy or store is set up for. All counts are per layer. */
typedef struct sieve_geometry {
  sieve_header hdr;
  int32_t n_layers;
  int32_t n_q_heads;
  int32_t n_kv_heads;  /* n_q_heads % n_kv_heads == 0; group g = n_q_heads / n_kv_heads */
  int32_t head_dim;
  int32_t page_size;   /* tokens per KV page */
  int32_t max_batch;   /* sequences per call */
  int32_t max_seq_len; /* tokens per sequence, prefill + decode */
  DLDataType kv_dtype; /* storage dtype of K/V pages: f32, f16 or bf16 */
  DLDevice device;     /* where K/V live and attention runs */
  float rope_theta;    /* RoPE base of the model (policies that rotate their own vectors need it) */
  int32_t rope_dim;    /* rotated channels per head (== head_dim for Llama) */
} sieve_geometry;

/* sieve_kv_config embeds a geometry by value, so the embedded one is the 1.0 layout, frozen: were
 * sieve_geometry ever to grow, this typedef becomes a copy of the 1.0 struct and kv_config's later
 * fields keep their offsets; the full geometry then travels by pointer (kv_config.geometry_ref,
 * ABI 1.1). tests/abi/v1_0 pins both sizes. */
typedef sieve_geometry sieve_geometry_v1_0;

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_ABI_H */
