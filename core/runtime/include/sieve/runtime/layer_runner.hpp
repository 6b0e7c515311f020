// Runs attention for one layer through that layer's chain, in the fixed hook order of
// api/sieve/policy.h: append K/V to the store, on_append, select (in chain order), attend (the
// chain's override or the core kernel), observe, correct; end_step once per instance per step.
//
// It owns the policy instances it creates (destroyed before the plugins' libraries can go, since
// each instance spec holds its LoadedPlugin) and the selection / statistics buffers, which it
// sizes at setup and grows only when a call is larger than every call before it: policies never
// allocate on the hot path.
//
// With `check` on (the default for `sieve attn` and `sieve conform`; benchmarks turn it off), a
// misbehaving plugin is caught and named: a bad status, a selection with an out-of-range or
// unordered key block, a row with a hole (an index entry select never wrote: check mode fills the
// selection's indices with kUnwrittenIndex before each select, O(capacity) per layer), NaN or Inf
// in the output. Every error is one line naming the plugin, its
// instance, the layer and the hook.
//
// With Options::cuda_graphs (CUDA only), a decode call of a layer whose chain declares
// SIEVE_CUDA_GRAPH_FULL runs its hooks and core kernel from a CUDA graph (layer_graph.hpp): the
// store's append and view stay eager, the rest is captured once and replayed while the call's
// key (O(batch) host data) is unchanged, so a step within a page does no per-hook host work and
// no per-kernel launch. A layer that cannot (a chain below FULL, page statistics, check mode, a
// step that records its selection) runs eagerly; graph_eager_reason says why, and the reasons
// are logged once when graphs are turned on. A layer whose key changes at nearly every call (a
// ragged batch where some sequence starts a page every step) stops capturing and runs eagerly:
// a capture costs far more than a replay saves.
#pragma once
#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sieve/policy.h"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/host_timers.hpp"
#include "sieve/runtime/layer_graph.hpp"
#include "sieve/util/grow_buffer.hpp"

namespace sieve::runtime {

// The new tokens of one layer for a batch of sequences, all on the attention device except the
// *_host arrays.
struct LayerInputs {
  int32_t layer = 0;
  uint32_t phase = SIEVE_PHASE_DECODE;
  uint64_t step = 0;
  int32_t batch = 0;
  const int32_t* seq_ids = nullptr;         // host [batch]
  const int32_t* qo_indptr_host = nullptr;  // host [batch + 1]: new tokens per sequence
  const DLTensor* qo_indptr = nullptr;      // the same on the attention device
  const int32_t* positions_host = nullptr;  // host [n_new]: absolute positions
  const DLTensor* q = nullptr;              // [n_new, n_q_heads, head_dim], post-RoPE
  const DLTensor* q_pre_rope = nullptr;     // optional
  const DLTensor* k = nullptr;              // [n_new, n_kv_heads, head_dim], post-RoPE
  const DLTensor* v = nullptr;
  const DLTensor* k_pre_rope = nullptr;     // optional (stores that keep pre-RoPE K need it)
};

// A host copy of the selection a layer's attention used (for fidelity measurement).
struct SelectionSnapshot {
  uint32_t kind = SIEVE_SEL_ALL;
  uint32_t heads = SIEVE_SEL_PER_SEQUENCE;
  int32_t q_block = 1;
  int32_t k_block_pages = 1;
  int32_t n_rows = 0;
  std::vector<int32_t> indptr, indices;
};

class LayerRunner {
 public:
  // What check mode fills a selection's index entries with before select (never a key block).
  static constexpr int32_t kUnwrittenIndex = INT32_MIN;

  struct Options {
    bool check = true;             // validate selections and outputs (see above)
    bool record_selections = false;  // keep a SelectionSnapshot per layer
    // Selection indices are sized for the worst case, q_block 1 (n_new * n_q_heads * pages
    // entries: 137 GB for a 128K-token prefill of 32 heads); > 1 sizes them for query blocks of
    // at least this many tokens (a policy with smaller blocks then gets SIEVE_ERR_CAPACITY).
    int32_t min_selection_q_block = 1;
    // Replay decode calls of FULL chains from CUDA graphs (see above); set_cuda_graphs toggles it.
    bool cuda_graphs = false;
  };

  // Creates every instance of `chains` (policy create; an empty chain of a layer means dense
  // attention by the core kernel); throws sieve::Error with one line naming the instance and the
  // plugin's reason when one cannot be created.
  LayerRunner(HostServices& services, const sieve_geometry& geometry, sieve_kv_store* kv,
              const sieve_kv_store_api* kv_api, ResolvedChains chains, Options options);
  ~LayerRunner();
  LayerRunner(const LayerRunner&) = delete;
  LayerRunner& operator=(const LayerRunner&) = delete;

  // Append the layer's new K/V and compute its attention into `out` ([n_new, n_q_heads,
  // head_dim] on the attention device). On failure: the status and one line in *error.
  sieve_status run_layer(const LayerInputs& in, DLTensor* out, std::string* error);

  // Only step 1 of run_layer: append the layer's new K/V and run the on_append hooks of the
  // layer's chain for in.phase, computing no attention (a benchmark fills a long context this way
  // at the cost of the appends; in.q may be null: on_append must not read it).
  sieve_status append_only(const LayerInputs& in, std::string* error);

  // Turn Options::record_selections on or off between calls (a benchmark records one untimed step).
  void set_record_selections(bool on) { options_.record_selections = on; }
  // Turn Options::cuda_graphs on or off between calls (the first time on, the reasons layers run
  // eagerly are logged).
  void set_cuda_graphs(bool on);
  // Why layer L's decode calls run eagerly with graphs on ("": they are replayed from graphs).
  const std::string& graph_eager_reason(int32_t layer) const { return graph_eager_.at(size_t(layer)); }
  const LayerGraphs::Counts& graph_counts() const { return graphs_.counts(); }

  // The step is over for these sequences: each instance that served a layer gets end_step once.
  sieve_status end_step(uint32_t phase, uint64_t step, const int32_t* seq_ids, int32_t batch,
                        std::string* error);

  const SelectionSnapshot& selection_used(int32_t layer) const { return snapshots_.at(size_t(layer)); }
  const ResolvedChains& chains() const { return chains_; }
  // The sieve_hook_bits instance `i` of chains() uses (asked after create; policy_hooks.hpp).
  uint32_t hooks(size_t i) const { return hooks_.at(i); }
  // Allocations the runner made for its own selection / statistics buffers (so a caller can tell
  // them from allocations made inside policy hooks).
  uint64_t buffer_allocations() const { return buffer_allocations_; }

 private:
  void ensure(util::GrowBuffer& b, size_t bytes);
  // The steps of run_layer, in order (each returns the status and sets *error on failure).
  struct LayerStep;
  sieve_status append_new(const LayerInputs& in, LayerStep& step, std::string* error);
  sieve_status view_layer(const LayerInputs& in, LayerStep& step, std::string* error);
  sieve_status run_on_append(LayerStep& step, std::string* error);
  sieve_status run_hooks(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error);
  sieve_status run_graphed(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error);
  void prepare_selection(const LayerInputs& in, DLTensor* out, LayerStep& step);
  sieve_status run_select(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error);
  sieve_status run_attend(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error);
  sieve_status run_correct(DLTensor* out, LayerStep& step, std::string* error);
  sieve_status record_selection(const LayerStep& step, std::string* error);
  std::string where(int32_t instance, int32_t layer, const char* hook) const;
  sieve_status plugin_failed(int32_t instance, int32_t layer, const char* hook, sieve_status st,
                             std::string* error) const;
  std::string check_selection(const sieve_attention_args& args);
  std::string poison_indices(const sieve_selection& sel, int64_t capacity);
  static std::string find_hole(const std::vector<int32_t>& indptr, const std::vector<int32_t>& indices, int64_t nnz);
  std::string check_output(const DLTensor& out, const int32_t* rows, int64_t n_rows);
  // Why layer L's decode chain cannot be replayed from a graph ("" if it can).
  std::string graph_blocker(int32_t layer) const;
  // What a graph of this call was built from (layer_graph.hpp), into key_.
  void graph_key(const LayerInputs& in, const DLTensor* out, const LayerStep& step);
  // The call the hooks see for `in` on `view` (the per-sequence lengths go to kv_len_).
  sieve_layer_call layer_call(const LayerInputs& in, sieve_paged_kv* view);
  // Instance `i` uses `hook` (a sieve_hook_bits bit): its own hooks, asked after create.
  bool uses(int32_t i, uint32_t hook) const { return (hooks_[size_t(i)] & hook) != 0; }
  // Destroy the instances created so far and throw `message` (the constructor's way out).
  [[noreturn]] void abandon_instances(sieve_status status, const std::string& message);

  HostServices& services_;
  sieve_geometry geometry_;
  sieve_kv_store* kv_;
  const sieve_kv_store_api* kv_api_;
  ResolvedChains chains_;
  std::vector<sieve_policy*> handles_;  // one per chains_.instances
  std::vector<uint32_t> hooks_;         // sieve_hook_bits each instance uses (policy_hooks.hpp)
  Options options_;

  util::GrowBuffer sel_indptr_, sel_indices_, lse_, page_mass_;  // services memory
  std::vector<std::vector<int32_t>> served_;  // per instance: layers since the last end_step
  std::vector<SelectionSnapshot> snapshots_;
  std::vector<int32_t> kv_len_;
  std::vector<int32_t> step_lens_;  // end_step's lengths, grow-only
  std::vector<unsigned char> host_scratch_;
  std::vector<int32_t> poison_;  // check mode: the fill copied into the selection's indices
  HostTimers timers_;
  uint64_t buffer_allocations_ = 0;
  LayerGraphs graphs_;
  std::vector<std::string> graph_eager_;  // per layer, decode: why no graph ("": replayable)
  std::vector<uint8_t> graph_warm_;       // per layer: a decode call ran eagerly already
  // Per layer: calls since its last capture, and captures in a row that came soon after the one
  // before (a key that changes nearly every call: run_graphed gives up on the layer).
  std::vector<int32_t> graph_since_capture_, graph_quick_recaptures_;
  std::vector<int64_t> key_;
  bool graph_reasons_logged_ = false;
  bool graph_churn_logged_ = false;
};

}  // namespace sieve::runtime
