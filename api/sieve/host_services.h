/* Sieve ABI v1 — what the host gives every plugin: memory, stream, logging, clock and the core
 * attention kernels. The host owns memory, streams and logging; whoever allocates frees.
 * Hooks on the per-layer hot path must not allocate (allocate scratch in create) and must not
 * synchronise the device with the host. */
#ifndef SIEVE_HOST_SERVICES_H
#define SIEVE_HOST_SERVICES_H

#include "sieve/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The core kernels, reached through the services table so a third-party plugin gets them without
 * linking Sieve's code: the ABI stays the only contract. */
typedef struct sieve_kernels {
  sieve_header hdr;
  /* Paged attention on the tensors' device (see sieve_attention_args). */
  sieve_status (*attend)(void* host_ctx, const sieve_attention_args* args);
  /* The message of the calling thread's last failed kernel call ("" if none). */
  const char* (*last_error)(void* host_ctx);
  /* ABI 1.1: sieve_variant_bits of the attention variants `attend` computes (absent: none). */
  uint32_t variants;
} sieve_kernels;

/* Attention variants (attention.h) a host's kernels offer. */
typedef enum sieve_variant_bits {
  SIEVE_VARIANT_KEY_SPANS = 1u << 0 /* sieve_attention_variant: key spans, packed keys, count
                                       weighting, per-key logit bias */
} sieve_variant_bits;

typedef struct sieve_host_services {
  sieve_header hdr;
  void* host_ctx; /* passed back to every callback */

  /* Memory on a device (kDLCPU or kDLCUDA). Alignment is a power of two (>= 16 is honoured). */
  void* (*alloc)(void* host_ctx, DLDevice device, size_t bytes, size_t alignment);
  void (*free)(void* host_ctx, DLDevice device, void* ptr);

  /* The CUDA stream (a cudaStream_t) every device call of this run is enqueued on; NULL = default
   * stream or no CUDA. */
  void* (*cuda_stream)(void* host_ctx);

  /* Log a line; `source` names the plugin (the host prefixes it). */
  void (*log)(void* host_ctx, sieve_log_level level, const char* source, const char* message);

  /* Monotonic clock, nanoseconds. */
  uint64_t (*now_ns)(void* host_ctx);

  const sieve_kernels* kernels;

  /* Report a measurement the host aggregates and prints (e.g. "kv_reduction", "density",
   * "selected_pages"): one value for (layer, head); head = -1 for the whole layer. Cheap and
   * allocation-free after the first report of a name; callable from hooks. */
  void (*metric)(void* host_ctx, const char* name, int32_t layer, int32_t head, double value);
} sieve_host_services;

#ifdef __cplusplus
}
#endif
#endif /* SIEVE_HOST_SERVICES_H */
