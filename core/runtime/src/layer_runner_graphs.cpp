// LayerRunner's CUDA-graph path (layer_runner.hpp, layer_graph.hpp): which layers may replay
// their decode calls, the key of a call, and capture / replay / giving up on a layer.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <map>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/runtime/descriptor_names.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/runtime/policy_hooks.hpp"
#include "sieve/util/tensor.hpp"
#include "layer_step.hpp"

namespace sieve::runtime {

std::string LayerRunner::graph_blocker(int32_t layer) const {
  if (geometry_.device.device_type != kDLCUDA) return "attention runs on " + device_name(geometry_.device);
  if (!LayerGraphs::available()) return "this build has no CUDA";
  std::string why;
  for (size_t i : chains_.chain(layer, SIEVE_PHASE_DECODE)) {
    const ResolvedInstance& inst = chains_.instances[i];
    const uint32_t level = inst.plugin.descriptor()->cuda_graph;
    std::string w;
    if (level < SIEVE_CUDA_GRAPH_FULL)
      w = "declares cuda_graph " + cuda_graph_name(level) +
          (level == SIEVE_CUDA_GRAPH_STATIC_SHAPES
               ? " (its launches follow the call's lengths, which every decode step changes; replaying "
                 "a step needs full)"
               : "");
    else if (uses(int32_t(i), SIEVE_HOOK_OBSERVE))
      w = "asks for page statistics (their buffers follow the page count)";
    if (!w.empty()) why += (why.empty() ? "" : "; ") + ("plugin '" + std::string(inst.plugin.name()) + "' (instance " + inst.label + ") " + w);
  }
  return why;
}

void LayerRunner::set_cuda_graphs(bool on) {
  options_.cuda_graphs = on;
  if (!on || graph_reasons_logged_) return;
  graph_reasons_logged_ = true;
  // Once: each distinct reason with the layers it keeps eager.
  std::map<std::string, std::vector<int32_t>> by_reason;
  for (int32_t L = 0; L < geometry_.n_layers; ++L)
    if (!graph_eager_[size_t(L)].empty()) by_reason[graph_eager_[size_t(L)]].push_back(L);
  for (const auto& [why, layers] : by_reason)
    spdlog::info("runtime: CUDA graphs: decode calls of {} of {} layers (first: {}) run eagerly: {}", layers.size(),
                 geometry_.n_layers, layers.front(), why);
}

sieve_status LayerRunner::run_graphed(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error) {
  const int32_t L = step.L;
  // A layer's first decode call runs eagerly: state the hooks and kernels create lazily (a
  // memory pool, a kernel's shared-memory limit) is made outside a capture, where it is refused.
  if (!graph_warm_[size_t(L)]) {
    graph_warm_[size_t(L)] = 1;
    return run_hooks(in, out, step, error);
  }
  // Buffers sized (and grown) now, outside the capture; the key holds their addresses.
  prepare_selection(in, out, step);
  graph_key(in, out, step);
  sieve_status st = SIEVE_OK;
  int32_t& since = graph_since_capture_[size_t(L)];
  if (graphs_.replay(L, key_, services_.cuda_stream(), &st, error)) {
    if (st == SIEVE_OK)
      for (size_t ci : *step.chain) served_[ci].push_back(L);  // what run_on_append records for end_step
    if (since < INT32_MAX) ++since;
    return st;
  }
  // A capture costs ~0.1 ms (H200, docs/bench/policy.md) against the few microseconds a replay
  // saves: a layer captured again within kQuickRecapture calls, kMaxQuickRecaptures times in a
  // row, would spend more capturing than it saves, and runs eagerly from then on.
  constexpr int32_t kQuickRecapture = 4, kMaxQuickRecaptures = 3;
  int32_t& quick = graph_quick_recaptures_[size_t(L)];
  quick = since < kQuickRecapture ? quick + 1 : 0;
  since = 0;
  if (quick >= kMaxQuickRecaptures) {
    graph_eager_[size_t(L)] = "its call changed (pages added, another batch) " + std::to_string(quick) +
                              " times in a row within " + std::to_string(kQuickRecapture) +
                              " calls: capturing would cost more than replays save";
    graphs_.release(L);
    if (!graph_churn_logged_) {
      graph_churn_logged_ = true;
      spdlog::info("runtime: CUDA graphs: layer {} runs eagerly from step {}: {} (said once)", L, in.step,
                   graph_eager_[size_t(L)]);
    }
    return run_hooks(in, out, step, error);
  }
  return graphs_.capture(L, key_, services_.cuda_stream(),
                         [&](std::string* e) { return run_hooks(in, out, step, e); }, error);
}

void LayerRunner::graph_key(const LayerInputs& in, const DLTensor* out, const LayerStep& step) {
  const sieve_paged_kv& v = step.view;
  auto addr = [](const void* p) { return int64_t(reinterpret_cast<intptr_t>(p)); };
  auto data = [&](const DLTensor* t) { return t ? addr(t->data) + int64_t(t->byte_offset) : int64_t(0); };
  int32_t max_pages = 0;
  for (int32_t b = 0; b < in.batch; ++b) max_pages = std::max(max_pages, kernels::kv_pages(v, b));
  key_.clear();
  key_.insert(key_.end(), {int64_t(in.batch), int64_t(step.n_new), data(in.q), data(in.q_pre_rope), data(in.k),
                           data(in.v), data(in.k_pre_rope), data(in.qo_indptr), data(out), data(&v.k_pages),
                           data(&v.v_pages), data(&v.k_pre_rope_pages), v.k_pages.shape[0], data(&v.indptr),
                           data(&v.indices), v.indices.shape[0], data(&v.last_page_len), int64_t(max_pages),
                           addr(sel_indptr_.get()), addr(sel_indices_.get()), step.capacity});
  for (int32_t b = 0; b < in.batch; ++b) key_.push_back(in.seq_ids[b]);
  for (int32_t b = 0; b <= in.batch; ++b) key_.push_back(in.qo_indptr_host[b]);
}

}  // namespace sieve::runtime
