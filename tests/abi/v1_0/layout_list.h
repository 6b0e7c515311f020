/* Every field, struct size and constant of ABI v1.0, as an X-macro list. layout_table.c expands it
 * once against the frozen headers (this directory) and once against the live ones (api/); the
 * test requires every v1.0 field at the same offset with the same size, every struct at least as
 * large, every constant unchanged: minor versions only append. Never edit this list: it is v1.0. */
#ifndef SIEVE_TEST_V1_0_LAYOUT_LIST_H
#define SIEVE_TEST_V1_0_LAYOUT_LIST_H

#define SIEVE_V1_0_LAYOUT(F, S, V)                                                                    \
  S(sieve_header) F(sieve_header, struct_size) F(sieve_header, version)                               \
  S(sieve_reason_sink) F(sieve_reason_sink, ctx) F(sieve_reason_sink, reason)                         \
  S(sieve_geometry) F(sieve_geometry, hdr) F(sieve_geometry, n_layers) F(sieve_geometry, n_q_heads)   \
  F(sieve_geometry, n_kv_heads) F(sieve_geometry, head_dim) F(sieve_geometry, page_size)              \
  F(sieve_geometry, max_batch) F(sieve_geometry, max_seq_len) F(sieve_geometry, kv_dtype)             \
  F(sieve_geometry, device) F(sieve_geometry, rope_theta) F(sieve_geometry, rope_dim)                 \
  S(sieve_paged_kv) F(sieve_paged_kv, hdr) F(sieve_paged_kv, batch) F(sieve_paged_kv, page_size)      \
  F(sieve_paged_kv, k_pages) F(sieve_paged_kv, v_pages) F(sieve_paged_kv, indptr)                     \
  F(sieve_paged_kv, indices) F(sieve_paged_kv, last_page_len) F(sieve_paged_kv, indptr_host)          \
  F(sieve_paged_kv, last_page_len_host) F(sieve_paged_kv, k_pre_rope_pages)                           \
  S(sieve_kv_append) F(sieve_kv_append, hdr) F(sieve_kv_append, layer) F(sieve_kv_append, batch)      \
  F(sieve_kv_append, seq_ids) F(sieve_kv_append, token_indptr) F(sieve_kv_append, k)                  \
  F(sieve_kv_append, v) F(sieve_kv_append, k_pre_rope)                                                \
  S(sieve_kv_config) F(sieve_kv_config, hdr) F(sieve_kv_config, geometry)                             \
  F(sieve_kv_config, pages_per_layer) F(sieve_kv_config, keep_pre_rope_k)                             \
  S(sieve_sidecar_desc) F(sieve_sidecar_desc, hdr) F(sieve_sidecar_desc, name)                        \
  F(sieve_sidecar_desc, dtype) F(sieve_sidecar_desc, elems_per_head)                                  \
  S(sieve_kv_store_api) F(sieve_kv_store_api, hdr) F(sieve_kv_store_api, name)                        \
  F(sieve_kv_store_api, create) F(sieve_kv_store_api, destroy) F(sieve_kv_store_api, last_error)      \
  F(sieve_kv_store_api, add_sequence) F(sieve_kv_store_api, remove_sequence)                          \
  F(sieve_kv_store_api, seq_len) F(sieve_kv_store_api, append) F(sieve_kv_store_api, view)            \
  F(sieve_kv_store_api, register_sidecar) F(sieve_kv_store_api, sidecar) F(sieve_kv_store_api, evict) \
  F(sieve_kv_store_api, bytes_in_use)                                                                 \
  S(sieve_selection) F(sieve_selection, hdr) F(sieve_selection, kind) F(sieve_selection, heads)       \
  F(sieve_selection, q_block) F(sieve_selection, k_block_pages) F(sieve_selection, n_rows)            \
  F(sieve_selection, indptr) F(sieve_selection, indices) F(sieve_selection, capacity)                 \
  S(sieve_attention_stats) F(sieve_attention_stats, hdr) F(sieve_attention_stats, request)            \
  F(sieve_attention_stats, page_mass) F(sieve_attention_stats, lse)                                   \
  S(sieve_attention_args) F(sieve_attention_args, hdr) F(sieve_attention_args, phase)                 \
  F(sieve_attention_args, n_q_heads) F(sieve_attention_args, n_kv_heads)                              \
  F(sieve_attention_args, head_dim) F(sieve_attention_args, scale) F(sieve_attention_args, q)         \
  F(sieve_attention_args, out) F(sieve_attention_args, qo_indptr)                                     \
  F(sieve_attention_args, qo_indptr_host) F(sieve_attention_args, kv)                                 \
  F(sieve_attention_args, selection) F(sieve_attention_args, q_rows) F(sieve_attention_args, stats)   \
  F(sieve_attention_args, lse) F(sieve_attention_args, page_mass)                                     \
  S(sieve_kernels) F(sieve_kernels, hdr) F(sieve_kernels, attend) F(sieve_kernels, last_error)        \
  S(sieve_host_services) F(sieve_host_services, hdr) F(sieve_host_services, host_ctx)                 \
  F(sieve_host_services, alloc) F(sieve_host_services, free) F(sieve_host_services, cuda_stream)      \
  F(sieve_host_services, log) F(sieve_host_services, now_ns) F(sieve_host_services, kernels)          \
  F(sieve_host_services, metric)                                                                      \
  S(sieve_param_spec) F(sieve_param_spec, hdr) F(sieve_param_spec, name) F(sieve_param_spec, type)    \
  F(sieve_param_spec, default_value) F(sieve_param_spec, min) F(sieve_param_spec, max)                \
  F(sieve_param_spec, choices) F(sieve_param_spec, doc)                                               \
  S(sieve_param_value) F(sieve_param_value, type) F(sieve_param_value, i) F(sieve_param_value, f)     \
  F(sieve_param_value, s) F(sieve_param_value, list) F(sieve_param_value, list_len)                   \
  S(sieve_policy_descriptor) F(sieve_policy_descriptor, hdr) F(sieve_policy_descriptor, name)         \
  F(sieve_policy_descriptor, vendor) F(sieve_policy_descriptor, version_major)                        \
  F(sieve_policy_descriptor, version_minor) F(sieve_policy_descriptor, version_patch)                 \
  F(sieve_policy_descriptor, summary) F(sieve_policy_descriptor, phases)                              \
  F(sieve_policy_descriptor, devices) F(sieve_policy_descriptor, dtypes)                              \
  F(sieve_policy_descriptor, head_dims) F(sieve_policy_descriptor, n_head_dims)                       \
  F(sieve_policy_descriptor, page_sizes) F(sieve_policy_descriptor, n_page_sizes)                     \
  F(sieve_policy_descriptor, selection_heads) F(sieve_policy_descriptor, needs)                       \
  F(sieve_policy_descriptor, evicts_kv) F(sieve_policy_descriptor, cuda_graph)                        \
  S(sieve_layer_call) F(sieve_layer_call, hdr) F(sieve_layer_call, layer) F(sieve_layer_call, phase)  \
  F(sieve_layer_call, step) F(sieve_layer_call, batch) F(sieve_layer_call, seq_ids)                   \
  F(sieve_layer_call, qo_indptr) F(sieve_layer_call, qo_indptr_host) F(sieve_layer_call, kv_len_host) \
  F(sieve_layer_call, q) F(sieve_layer_call, q_pre_rope) F(sieve_layer_call, positions_host)          \
  F(sieve_layer_call, geometry) F(sieve_layer_call, kv) F(sieve_layer_call, kv_api)                   \
  F(sieve_layer_call, kv_view)                                                                        \
  S(sieve_step_end) F(sieve_step_end, hdr) F(sieve_step_end, phase) F(sieve_step_end, step)           \
  F(sieve_step_end, batch) F(sieve_step_end, seq_ids) F(sieve_step_end, kv_len_host)                  \
  F(sieve_step_end, layers) F(sieve_step_end, n_layers) F(sieve_step_end, kv) F(sieve_step_end, kv_api) \
  S(sieve_policy_api) F(sieve_policy_api, hdr) F(sieve_policy_api, descriptor)                        \
  F(sieve_policy_api, params) F(sieve_policy_api, n_params) F(sieve_policy_api, validate)             \
  F(sieve_policy_api, create) F(sieve_policy_api, destroy) F(sieve_policy_api, last_error)            \
  F(sieve_policy_api, on_append) F(sieve_policy_api, select) F(sieve_policy_api, attend)              \
  F(sieve_policy_api, observe) F(sieve_policy_api, correct) F(sieve_policy_api, end_step)             \
  S(sieve_plugin) F(sieve_plugin, hdr) F(sieve_plugin, abi_major) F(sieve_plugin, name)               \
  F(sieve_plugin, policy) F(sieve_plugin, kv_store)                                                   \
  V(SIEVE_ABI_MAJOR) V(SIEVE_OK) V(SIEVE_ERR_INVALID_ARGUMENT) V(SIEVE_ERR_UNSUPPORTED)               \
  V(SIEVE_ERR_VERSION) V(SIEVE_ERR_OUT_OF_MEMORY) V(SIEVE_ERR_CAPACITY) V(SIEVE_ERR_DEVICE)           \
  V(SIEVE_ERR_NOT_FOUND) V(SIEVE_ERR_INTERNAL) V(SIEVE_PHASE_PREFILL) V(SIEVE_PHASE_DECODE)           \
  V(SIEVE_DEVICE_CPU) V(SIEVE_DEVICE_CUDA) V(SIEVE_DTYPE_F32) V(SIEVE_DTYPE_F16) V(SIEVE_DTYPE_BF16)  \
  V(SIEVE_LOG_TRACE) V(SIEVE_LOG_DEBUG) V(SIEVE_LOG_INFO) V(SIEVE_LOG_WARN) V(SIEVE_LOG_ERROR)        \
  V(SIEVE_SEL_PER_SEQUENCE) V(SIEVE_SEL_PER_KV_HEAD) V(SIEVE_SEL_PER_Q_HEAD) V(SIEVE_SEL_ALL)         \
  V(SIEVE_SEL_BLOCKS) V(SIEVE_STATS_NONE) V(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD)                        \
  V(SIEVE_STATS_PAGE_MASS_ALL_HEADS) V(SIEVE_PARAM_BOOL) V(SIEVE_PARAM_INT) V(SIEVE_PARAM_FLOAT)      \
  V(SIEVE_PARAM_STRING) V(SIEVE_PARAM_ENUM) V(SIEVE_PARAM_INT_LIST) V(SIEVE_NEEDS_PAGE_STATS)         \
  V(SIEVE_NEEDS_PRE_ROPE_K) V(SIEVE_NEEDS_PRE_ROPE_Q) V(SIEVE_NEEDS_WEIGHTS_FILE)                     \
  V(SIEVE_NEEDS_SIDECARS) V(SIEVE_CUDA_GRAPH_NONE) V(SIEVE_CUDA_GRAPH_STATIC_SHAPES)                  \
  V(SIEVE_CUDA_GRAPH_FULL)

#endif
