// streaming: StreamingLLM (Xiao et al., "Efficient Streaming Language Models with Attention
// Sinks") as a selection policy.
//
// Method: every query attends the first `sink` tokens of its sequence (the attention sinks) and
// the `window` most recent tokens ending at itself; nothing else. The selection is a list of key
// blocks with k_block_pages = 1 (a block is a page), one row per (sequence, query block) shared by
// every head (SIEVE_SEL_PER_SEQUENCE):
//   decode  (q_block = 1): sequence b with L = kv_len_host[b] resident tokens lists the pages
//           holding tokens [0, sink) and [max(0, L - window), L);
//   prefill (q_block = page_size): query block t, whose queries sit at positions [first, last],
//           lists the sink pages and the pages holding [first - window + 1, last]; causality
//           inside the listed pages is the kernel's job.
// The lists are at page granularity: a page partly inside the sink or the window is attended
// whole, so the attended set is a superset of sink + window (by less than a page at each edge).
// The selection replaces whatever the chain selected before (it does not intersect).
//
// Hooks: select. Core kernels: block-sparse paged attention over the selection (through the
// host). CPU selections are written directly; CUDA selections by two small kernels in
// cuda/streaming_select.cu on the host's stream, which read the lengths from the view's device
// page table and use one scratch array allocated in create: no per-call allocation or
// synchronisation. Host services: alloc/free (CUDA scratch), cuda_stream, log.
// CUDA graphs: STATIC_SHAPES — the launch shape and the host-side capacity check follow the
// batch and the lengths of the call being captured.
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <climits>
#include <cstdint>

#include "streaming_rows.hpp"
#if SIEVE_WITH_CUDA
#include "cuda/streaming_select.hpp"
#endif

namespace {

namespace sp = sieve::plugin;
namespace ss = sieve::streaming;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;  // a CPU-only build cannot write CUDA selections
#endif

class StreamingPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::int_param("sink", "4", 0, INT32_MAX, "first tokens of the sequence every query attends"),
      sp::int_param("window", "1024", 1, INT32_MAX,
                    "most recent tokens every query attends, itself included"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "streaming",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "StreamingLLM: attention sinks + a recent window, at page granularity",
      .phases = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE,
      .devices = kDevices,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_SEQUENCE,
      .needs = 0,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_STATIC_SHAPES,
      .conform_params = "sink=4,window=64",
      .selection_basis = SIEVE_SELECTION_BASIS_POSITIONAL,
      // Reads no K/V page itself (the core kernels do, honouring strides): any layout.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };

  // Reasons beyond the schema ranges and the generic geometry checks, which already refuse
  // window < 1 (so sink + window >= 1 token), sink < 0, page_size <= 0 and the like.
  static void validate(const sieve_geometry& g, const sp::Params&, sp::Reasons& r) {
    // Prefill rows are one per page of queries; n_rows is an int32 of the selection.
    const int64_t pages = (int64_t(g.max_seq_len) + g.page_size - 1) / g.page_size;
    const int64_t max_rows = int64_t(g.max_batch) * pages;
    if (max_rows > INT32_MAX)
      r.unsupported("max_batch x pages per sequence = ", max_rows,
                    " selection rows exceed the int32 row count");
  }

  explicit StreamingPolicy(const sp::CreateContext& ctx)
      : PolicyBase(ctx), sink_(ctx.params.integer("sink")), window_(ctx.params.integer("window")) {
#if SIEVE_WITH_CUDA
    if (geometry().device.device_type == kDLCUDA)
      row_start_ = allocate(geometry().device, sizeof(int32_t) * (size_t(geometry().max_batch) + 1));
#endif
    if (sink_ + window_ >= geometry().max_seq_len)
      log_warn("sink + window = ", sink_ + window_, " covers max_seq_len = ",
               geometry().max_seq_len, ": every row is dense");
    log_debug("sink = ", sink_, ", window = ", window_, ", page_size = ", geometry().page_size);
  }

  void select(const sieve_layer_call& call, sieve_selection& selection, uint32_t&) override {
    const sieve_geometry& g = geometry();
    const int32_t page_size = g.page_size;
    if (call.phase != SIEVE_PHASE_PREFILL && call.phase != SIEVE_PHASE_DECODE)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "phase ", call.phase, " is neither prefill nor decode");
    const bool decode = call.phase == SIEVE_PHASE_DECODE;
    if (call.batch < 0 || call.batch > g.max_batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "batch = ", call.batch, " is outside [0, max_batch = ",
               g.max_batch, "]");
    sp::require_struct(call.kv_view, "KV view");
    const sieve_paged_kv& view = *call.kv_view;
    if (view.page_size != page_size)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view has page_size ", view.page_size,
               ", the policy was created for ", page_size);
    if (view.batch != call.batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view has ", view.batch,
               " sequences, the call has ", call.batch);
    if (call.batch > 0 && (!call.kv_len_host || !call.qo_indptr_host || !view.indptr_host ||
                           !view.last_page_len_host))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT,
               "kv_len_host, qo_indptr_host or the view's host page table is NULL");

    // Pass 1 on the host mirrors: check the lengths, count rows and entries (for the capacity
    // check), so a failure leaves the selection untouched.
    const int32_t q_block = decode ? 1 : page_size;
    int64_t n_rows = 0, nnz = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      const int64_t kv_len = call.kv_len_host[b];
      if (decode && n_new != 1)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "decode has one query per sequence, sequence ", b,
                 " has ", n_new);
      if (n_new < 0 || n_new > kv_len)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " has ", n_new,
                 " queries but kv_len ", kv_len);
      if (kv_len != sp::view_tokens(view, b))
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "kv_len_host[", b, "] = ", kv_len,
                 " but the KV view holds ", sp::view_tokens(view, b), " tokens");
      const int32_t blocks = ss::query_blocks(n_new, q_block);
      for (int32_t t = 0; t < blocks; ++t)
        nnz += ss::block_pages(kv_len, n_new, q_block, t, sink_, window_, page_size).count();
      n_rows += blocks;
    }
    if (n_rows > INT32_MAX)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, n_rows, " selection rows exceed the int32 row count");
    sp::check_selection_storage(selection, n_rows, nnz, g.device);

    if (g.device.device_type == kDLCPU) write_cpu(call, selection, q_block);
    else write_cuda(call, selection, q_block, int32_t(n_rows));

    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = SIEVE_SEL_PER_SEQUENCE;
    selection.q_block = q_block;
    selection.k_block_pages = 1;
    selection.n_rows = int32_t(n_rows);
  }

 private:
  void write_cpu(const sieve_layer_call& call, sieve_selection& selection, int32_t q_block) const {
    auto* indptr = sieve::data_ptr<int32_t>(selection.indptr);
    auto* indices = sieve::data_ptr<int32_t>(selection.indices);
    int32_t row = 0, offset = 0;
    indptr[0] = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      const int32_t blocks = ss::query_blocks(n_new, q_block);
      for (int32_t t = 0; t < blocks; ++t) {
        const ss::RowPages pages = ss::block_pages(call.kv_len_host[b], n_new, q_block, t, sink_,
                                                   window_, geometry().page_size);
        for (int32_t j = 0; j < pages.count(); ++j) indices[offset++] = pages.page(j);
        indptr[++row] = offset;
      }
    }
  }

#if SIEVE_WITH_CUDA
  void write_cuda(const sieve_layer_call& call, sieve_selection& selection, int32_t q_block,
                  int32_t n_rows) const {
    const sieve_paged_kv& view = *call.kv_view;
    const DLDevice dev = geometry().device;
    auto device_int32 = [&](const DLTensor* t, const char* what, int64_t n) -> const int32_t* {
      if (!t || !t->data || !sieve::same_dtype(t->dtype, sieve::kI32) || t->ndim != 1 ||
          t->shape[0] < n || !sieve::is_contiguous(*t) || t->device.device_type != dev.device_type ||
          t->device.device_id != dev.device_id)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " must be a contiguous int32 [", n,
                 "] tensor on ", sieve::device_name(dev));
      return sieve::data_ptr<const int32_t>(*t);
    };
    ss::SelectLaunch a{};
    a.qo_indptr = device_int32(call.qo_indptr, "qo_indptr", call.batch + 1);
    a.kv_indptr = device_int32(&view.indptr, "the KV view's indptr", call.batch + 1);
    a.last_page_len = device_int32(&view.last_page_len, "the KV view's last_page_len", call.batch);
    a.batch = call.batch;
    a.page_size = geometry().page_size;
    a.q_block = q_block;
    a.sink = sink_;
    a.window = window_;
    a.row_start = row_start_.get<int32_t>();
    a.sel_indptr = sieve::data_ptr<int32_t>(selection.indptr);
    a.sel_indices = sieve::data_ptr<int32_t>(selection.indices);
    a.n_rows = n_rows;
    a.capacity = selection.capacity;
    a.stream = cuda_stream();
    if (const char* error = ss::launch_streaming_select(a))
      sp::fail(SIEVE_ERR_DEVICE, "streaming selection kernel launch failed: ", error);
  }
#else
  [[noreturn]] void write_cuda(const sieve_layer_call&, sieve_selection&, int32_t, int32_t) const {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of streaming has no CUDA code");
  }
#endif

  int64_t sink_;
  int64_t window_;
#if SIEVE_WITH_CUDA
  sp::HostBuffer row_start_;  // device int32 [max_batch + 1]: first selection row of each sequence
#endif
};

}  // namespace

SIEVE_DEFINE_PLUGIN(StreamingPolicy);
