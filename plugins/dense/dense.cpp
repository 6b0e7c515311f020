// dense: attend to everything.
//
// Method: no sparsity. Its one hook, `select`, resets the chain's selection to kind
// SIEVE_SEL_ALL, so whatever ran before it in the chain is undone (`streaming>dense` ends dense)
// and the core's dense paged-attention kernel (decode, or causal prefill) runs on the whole
// resident KV. It has no kernel of its own and touches no tensor: the selection it emits is
// device-agnostic, so it declares CPU and CUDA, every storage dtype, any head dim and page size,
// and full CUDA-graph capture (select does no device work at all). No parameters.
// Hooks: select. Core kernels: dense paged attention (through the host). Host services: none.
#include <sieve/plugin/policy_api.hpp>

namespace {

namespace sp = sieve::plugin;

class DensePolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "dense",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "attend to every resident key (resets the chain's selection to dense)",
      .phases = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE,
      .devices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_SEQUENCE,
      .needs = 0,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_FULL,
      .conform_params = nullptr,
      .selection_basis = SIEVE_SELECTION_BASIS_NONE,
      // Reads no K/V page itself (the core kernels do, honouring strides): any layout.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };

  explicit DensePolicy(const sp::CreateContext& ctx) : PolicyBase(ctx) {}

  void select(const sieve_layer_call&, sieve_selection& selection, uint32_t&) override {
    // Only the header fields change: with kind ALL the kernel ignores the lists, so the host's
    // indptr/indices storage is left as it is (no device write, nothing to capture).
    selection.kind = SIEVE_SEL_ALL;
    selection.heads = SIEVE_SEL_PER_SEQUENCE;
    selection.q_block = 1;
    selection.k_block_pages = 1;
    selection.n_rows = 0;
  }
};

}  // namespace

SIEVE_DEFINE_PLUGIN(DensePolicy);
