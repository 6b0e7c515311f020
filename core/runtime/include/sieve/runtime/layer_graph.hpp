// CUDA graphs of one layer's decode call, for LayerRunner: the device work of a layer's hooks
// and core kernel (on_append, select, attend, observe, correct) captured once and replayed at
// later steps while everything its launches were built from is unchanged, as vLLM and SGLang
// replay their decode graphs.
//
// What a replay may skip is what the ABI says a policy's launches depend on
// (sieve_cuda_graph_level): a chain at SIEVE_CUDA_GRAPH_FULL reads the lengths on the device, so
// its launches depend only on the buffers it is handed (their addresses and shapes); the core
// kernel's plan depends on the batch and the page counts. The key of a layer's call is therefore
// O(batch) host data: the batch and its sequence ids, the query counts, the store view's device
// arrays (addresses, page count, longest sequence in pages), the call's tensors and the runner's
// selection buffers. Within a page, a decode step has the key of the step before it; a page
// boundary, a new batch or a grown buffer changes it and the call is captured again (the
// executable graph updated in place where the topology allows, else instantiated anew).
// The store's append and view run eagerly before the key is taken: their work (the new token's
// K/V, the page table) is what the graph's kernels then read from the device.
//
// Without CUDA in the build, no graph is ever used (enabled() is false).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sieve/policy.h"

namespace sieve::runtime {

class LayerGraphs {
 public:
  explicit LayerGraphs(int32_t n_layers);
  ~LayerGraphs();
  LayerGraphs(const LayerGraphs&) = delete;
  LayerGraphs& operator=(const LayerGraphs&) = delete;

  // Whether this build can capture CUDA graphs at all.
  static bool available();

  // Replays layer L's graph when `key` equals the key it was captured with: true after the
  // launch was enqueued, false when there is no such graph (nothing enqueued). A failed launch
  // returns true with *status and *error set.
  bool replay(int32_t layer, const std::vector<int64_t>& key, void* stream, sieve_status* status, std::string* error);

  // Captures `work` (which enqueues the call's device work on `stream` and returns its status)
  // as layer L's graph for `key`, then launches it. When `work` fails, or capture does (a hook
  // that synchronises, allocates or uses another stream), nothing is launched, the layer's graph
  // is dropped and the status and one line are returned.
  sieve_status capture(int32_t layer, const std::vector<int64_t>& key, void* stream,
                       const std::function<sieve_status(std::string*)>& work, std::string* error);

  // Drops layer L's graph (its calls run eagerly from now on; the caller stops asking).
  void release(int32_t layer) { drop(layers_.at(size_t(layer))); }

  struct Counts {
    uint64_t replays = 0;    // calls served by a replay
    uint64_t captures = 0;   // calls captured (a new key)
    uint64_t updates = 0;    // of those, executable graphs updated in place
  };
  const Counts& counts() const { return counts_; }

 private:
  struct Layer {
    std::vector<int64_t> key;
    void* exec = nullptr;  // cudaGraphExec_t
  };
  void drop(Layer& l);

  std::vector<Layer> layers_;
  Counts counts_;
};

}  // namespace sieve::runtime
