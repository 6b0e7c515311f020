// The Quest min/max sidecar as a policy holds it (Quest and RaaS share this): registration on the
// store at create, and the on_append maintenance on the call's device (CPU loop or the fused CUDA
// kernel, page_bound_cuda.hpp), with host-side bookkeeping of how many resident tokens of each
// (layer, sequence) are folded in.
//
// Catch-up: when a sequence holds tokens this instance never saw (the policy is in the decode
// chain only, so the prompt's on_append went elsewhere; or a sequence id was reused), the
// sequences of the call are recomputed from their pages — the same values incremental maintenance
// would have produced. Detection compares the resident length before the append with the folded
// count, so a reused id whose new prompt has exactly the old length is not detected: put the
// policy in the prefill chain too (`2-=quest(...)`), where every token is seen as it arrives.
#pragma once
#include <sieve/policy.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sieve::selection {

class MinMaxSidecar {
 public:
  MinMaxSidecar() = default;
  // Registers `base_name` (or base_name.N when another instance holds it) on the store.
  // Throws sieve::Error when the store is missing or refuses.
  MinMaxSidecar(sieve_kv_store* kv, const sieve_kv_store_api* kv_api, const sieve_geometry& g,
                const char* base_name);

  const std::string& name() const { return name_; }
  int32_t slot() const { return slot_; }

  // The layer's sidecar tensor [capacity, n_kv_heads, 2 * head_dim] (KV dtype, store's device).
  DLTensor tensor(const sieve_layer_call& call) const;

  // Fold the call's new tokens (qo_indptr) into the sidecar of call.layer. `stream`: the host's
  // CUDA stream (CUDA views). Returns true when a catch-up recomputation ran.
  bool on_append(const sieve_layer_call& call, void* stream);

  // Resident tokens of (layer, seq) the sidecar covers (-1: never seen).
  int32_t folded(int32_t layer, int32_t seq_id) const;
  // Forget the pages dropped by an eviction: the resident count shrinks by `tokens`.
  void evicted(int32_t layer, int32_t seq_id, int32_t tokens);

 private:
  std::string name_;
  int32_t slot_ = -1;
  sieve_geometry geometry_{};
  std::vector<std::vector<int32_t>> folded_;  // [layer][seq_id]
  std::vector<int32_t> new_tokens_;            // host scratch [max_batch + 1]
};

}  // namespace sieve::selection
