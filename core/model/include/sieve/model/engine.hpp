// The forward pass of a Llama-family model on CPU (OpenBLAS) or CUDA (cuBLAS + small kernels),
// with every layer's attention run through the runtime: one runtime::Session for the model (its KV
// store for all layers, the chains' policy instances, the LayerRunner), the layer's chain for the phase.
//
// Per layer, for the new tokens of a call (row-major, [n, ...]):
//   xb = RMSNorm(x) · rms_att                        eps from the model (llama2.c: 1e-5)
//   q = xb Wq^T (+bq), k = xb Wk^T (+bk), v = xb Wv^T (+bv)
//   pre-RoPE copies of q / k when the chains need them (SIEVE_NEEDS_PRE_ROPE_Q / _K)
//   RoPE(q), RoPE(k) at each token's absolute position (consecutive pairs, model.hpp)
//   att = LayerRunner::run_layer(q, k, v)             appends K/V, runs the chain + core kernel
//   x += att Wo^T
//   x += (silu(RMSNorm(x)·rms_ffn W1^T) ⊙ (RMSNorm(x)·rms_ffn W3^T)) W2^T
// then logits = RMSNorm(x_last)·rms_final · E^T for the last token of each sequence.
//
// prefill() runs every new token of every listed sequence in ONE pass per layer (phase PREFILL,
// causal); decode() runs one token per sequence for any set of sequences of different lengths
// (phase DECODE, step counter +1 per call). Both end with LayerRunner::end_step.
//
// Errors (a plugin failing, a sequence too long for max_seq_len, a device error) throw
// sieve::Error with one line; the engine stays usable only for remove_sequence / destruction.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "sieve/kv_store.h"
#include "sieve/model/model.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/runtime/session.hpp"
#include "sieve/util/grow_buffer.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::model {

namespace detail {
class Ops;
}

struct EngineOptions {
  DLDevice device = kCpu;
  int32_t page_size = 16;    // tokens per KV page (the core stores take 16, 32, 64)
  int32_t max_batch = 8;     // sequences per call
  int32_t max_seq_len = 0;   // tokens per sequence; 0: the model's seq_len
  DLDataType kv_dtype = kF32;
  bool check = true;              // LayerRunner checks (selections, finite outputs)
  bool record_selections = false; // keep each layer's selection (fidelity measurement)
};

// What a probe sees right after a layer's attention ran (before the output projection): the
// call's query and attention output on the attention device, and the store whose view of the
// layer is valid until the next append.
struct LayerProbe {
  int32_t layer = 0;
  uint32_t phase = SIEVE_PHASE_DECODE;
  uint64_t step = 0;
  int32_t batch = 0;
  const int32_t* seq_ids = nullptr;         // host [batch]
  const int32_t* qo_indptr_host = nullptr;  // host [batch + 1]
  const int32_t* positions_host = nullptr;  // host [n]
  const DLTensor* q = nullptr;              // [n, n_heads, head_dim], post-RoPE
  const DLTensor* out = nullptr;            // [n, n_heads, head_dim]
  sieve_kv_store* kv = nullptr;
  const sieve_kv_store_api* kv_api = nullptr;
  runtime::HostServices* services = nullptr;
  const runtime::LayerRunner* runner = nullptr;
};
using ProbeFn = std::function<void(const LayerProbe&)>;

class Engine {
 public:
  // The geometry chains are resolved against (resolve_chains) for this model and options.
  static sieve_geometry geometry_for(const ModelConfig& config, const EngineOptions& options);

  // `weights` is copied to the device (it need not outlive the engine). `chains` must have been
  // resolved against geometry_for(weights.config, options); empty chains: dense core attention.
  // The registry the chains came from must outlive the engine.
  Engine(const ModelWeights& weights, const EngineOptions& options, runtime::ResolvedChains chains);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int32_t add_sequence();
  void remove_sequence(int32_t seq);
  // Tokens sequence `seq` has been fed so far (its next position).
  int32_t seq_len(int32_t seq) const;
  // Tokens of `seq` resident in `layer` (the store's count: fewer than seq_len after evictions).
  int32_t resident_tokens(int32_t layer, int32_t seq) const;

  // Feed tokens[b] to sequence seq_ids[b] (each non-empty), all in one pass per layer. `logits`
  // receives [batch, vocab]: the next-token logits after each sequence's last new token.
  void prefill(std::span<const int32_t> seq_ids, const std::vector<std::vector<int32_t>>& tokens,
               std::vector<float>* logits);
  // One token per sequence.
  void decode(std::span<const int32_t> seq_ids, std::span<const int32_t> tokens, std::vector<float>* logits);

  // Called after every layer's attention (nullptr: none).
  void set_probe(ProbeFn probe) { probe_ = std::move(probe); }

  uint64_t kv_bytes() const;  // the store's bytes_in_use (every layer)
  const ModelConfig& config() const { return config_; }
  const sieve_geometry& geometry() const { return geometry_; }
  const EngineOptions& options() const { return options_; }
  const runtime::LayerRunner& runner() const { return session_->runner(); }
  const runtime::Session& session() const { return *session_; }
  runtime::HostServices& services() { return *services_; }
  uint64_t decode_steps() const { return step_; }

 private:
  struct DeviceLayer;
  void check_sizes(const ModelWeights& w) const;
  void setup(const ModelWeights& w, runtime::ResolvedChains chains);
  float* upload(const std::vector<float>& v);
  // forward's steps, in order.
  struct CallViews;
  void check_call(std::span<const int32_t> seq_ids, const std::vector<int32_t>& qo_indptr,
                  const std::vector<int32_t>& tokens) const;
  void ensure_activations(int32_t n, int32_t batch);
  void upload_call(uint32_t phase, std::span<const int32_t> seq_ids, const std::vector<int32_t>& qo_indptr,
                   const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions, CallViews* views);
  void attention_block(int32_t layer, CallViews& views);
  void ffn_block(int32_t layer, int32_t n);
  void last_token_logits(int32_t batch, std::vector<float>* logits);
  void forward(uint32_t phase, std::span<const int32_t> seq_ids, const std::vector<int32_t>& qo_indptr,
               const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions, std::vector<float>* logits);

  ModelConfig config_;
  EngineOptions options_;
  sieve_geometry geometry_{};
  std::unique_ptr<runtime::HostServices> services_;
  std::unique_ptr<detail::Ops> ops_;
  std::unique_ptr<runtime::Session> session_;  // the store, the policy instances, the runner
  bool need_pre_q_ = false, need_pre_k_ = false;
  uint64_t step_ = 0;
  std::map<int32_t, int32_t> seq_pos_;
  ProbeFn probe_;

  // Weights on the device.
  std::vector<void*> weight_ptrs_;
  std::vector<DeviceLayer> layers_;
  const float* embedding_ = nullptr;
  const float* rms_final_ = nullptr;
  const float* classifier_ = nullptr;

  // Activations (device memory of ops_), grown to the largest call so far.
  util::GrowBuffer x_, xb_, q_, k_, v_, q_pre_, k_pre_, att_, h1_, h3_, tok_, pos_, qo_, last_, xlast_, logits_;
};

}  // namespace sieve::model
