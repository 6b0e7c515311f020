// raas on a CUDA KV store stamps and evicts exactly what it does on the CPU: the same chain runs
// through two LayerRunners, one over the paged CPU store, one over the paged CUDA store (runtime
// host services, a non-blocking stream, no checks, so nothing synchronises between the hooks and
// end_step but raas itself), fed the same random tokens: ragged prompts, then many single-token
// decode steps. After every step both stores hold the same physical pages for every (layer,
// sequence) — the stores share their page allocator, so equal page lists mean the same stamps and
// the same evictions — and the same bytes_in_use, which stop growing once every sequence reached
// the budget. A CPU run that never stamps (alpha = 1) evicts differently, so the stamps matter.
// Hooks allocate nothing on the CUDA side. With prefill_policy=quest both runners also record the
// selection each layer's attention used: at every decode step the CUDA one equals the CPU one,
// both equal the reference (quest_reference.hpp: Quest from the raw keys over each sequence's
// prompt pages, then every decode page), and both outputs are the f64 attention of that selection
// within the rounding bound of their arithmetic (attention_tolerance.hpp).
// Skips without a CUDA device (the descriptor test runs).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sieve/kernels/attention_args.hpp>
#include <sieve/kv/paged_store.hpp>
#include <sieve/reference/attention_ref.hpp>
#include <sieve/runtime/chain_spec.hpp>
#include <sieve/runtime/host_copy.hpp>
#include <sieve/runtime/host_services.hpp>
#include <sieve/runtime/layer_runner.hpp>
#include <sieve/runtime/registry.hpp>
#include <sieve/util/tensor.hpp>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../quest/quest_reference.hpp"
#include "../support/chain_session.hpp"
#include "../support/cuda_device.hpp"
#include "common/attention_tolerance.hpp"

namespace {

using namespace sieve::runtime;

constexpr int32_t kBatch = 3, kLayers = 2, kPage = 16, kMaxSeq = 512;
constexpr int32_t kBudgetPages = 8;  // token_budget=128

sieve_geometry geometry(DLDataType dtype, DLDevice device) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = kLayers;
  g.n_q_heads = 8;
  g.n_kv_heads = 2;
  g.head_dim = 64;
  g.rope_dim = 64;
  g.rope_theta = 10000.f;
  g.page_size = kPage;
  g.max_batch = kBatch;
  g.max_seq_len = kMaxSeq;
  g.kv_dtype = dtype;
  g.device = device;
  return g;
}

Registry& registry() {
  static Registry reg = sieve::testing::registry_with();
  return reg;
}

// Device memory holding a copy of a host tensor (a test helper: copies synchronously).
struct DeviceCopy {
  void* p = nullptr;
  DLTensor t{};
  explicit DeviceCopy(const DLTensor& host) {
    const size_t bytes = size_t(sieve::numel(host)) * sieve::dtype_bytes(host.dtype);
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 4)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the plugin's stream does not wait for it
    t = host;
    t.data = p;
    t.device = DLDevice{kDLCUDA, 0};
  }
  ~DeviceCopy() { cudaFree(p); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
};

// One device's runtime: host services, a paged store with kBatch sequences, the chain's runner.
struct Side {
  DLDevice device;
  std::unique_ptr<HostServices> services;
  const sieve_kv_store_api* api = nullptr;
  sieve_kv_store* store = nullptr;
  std::vector<int32_t> ids;
  std::unique_ptr<LayerRunner> runner;

  Side(DLDevice dev, DLDataType dtype, const std::string& chain, bool record = false) : device(dev) {
    services = std::make_unique<HostServices>(dev);
    const sieve_geometry g = geometry(dtype, dev);
    const ChainSpec spec = sieve::testing::parse_chain(chain);
    ResolvedChains chains;
    std::vector<std::string> errors;
    EXPECT_TRUE(resolve_chains(spec, registry(), g, &chains, &errors))
        << chain << " on " << sieve::device_name(dev) << ": " << (errors.empty() ? "" : errors[0]);
    api = dev.device_type == kDLCUDA ? sieve::kv::paged_cuda_store_api() : sieve::kv::paged_cpu_store_api();
    sieve_kv_config kc{};
    kc.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    kc.geometry = g;
    kc.pages_per_layer = kBatch * (kMaxSeq / kPage);
    std::string reason;
    sieve_reason_sink sink{&reason, [](void* c, const char* m) { *static_cast<std::string*>(c) = m ? m : ""; }};
    EXPECT_EQ(api->create(services->table(), &kc, &store, sink), SIEVE_OK) << reason;
    ids.assign(kBatch, -1);
    for (auto& id : ids) EXPECT_EQ(api->add_sequence(store, &id), SIEVE_OK);
    LayerRunner::Options o;
    o.check = dev.device_type == kDLCPU;  // the CUDA side: no host copies between the hooks
    o.record_selections = record;         // a host copy of each layer's selection (synchronises)
    runner = std::make_unique<LayerRunner>(*services, g, store, api, std::move(chains), o);
  }
  ~Side() {
    runner.reset();  // instances go before the store
    if (store) api->destroy(store);
  }

  // Pages of (layer, sequence b) as physical ids (the device's page table read back).
  std::vector<int32_t> pages(int32_t layer, int32_t b) {
    sieve_paged_kv v{};
    v.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    EXPECT_EQ(api->view(store, layer, &ids[size_t(b)], 1, &v), SIEVE_OK) << api->last_error(store);
    std::vector<int32_t> out(size_t(v.indptr_host[1]));
    if (device.device_type == kDLCUDA) {
      std::string err;
      EXPECT_TRUE(services->synchronize(&err)) << err;  // the view's upload is on the stream
      EXPECT_EQ(cudaMemcpy(out.data(), v.indices.data, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::copy_n(static_cast<const int32_t*>(v.indices.data), out.size(), out.data());
    }
    return out;
  }
  // Every sequence's pages of `layer` (the CPU store: host tensors).
  sieve_paged_kv view(int32_t layer) {
    sieve_paged_kv v{};
    v.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    EXPECT_EQ(api->view(store, layer, ids.data(), kBatch, &v), SIEVE_OK) << api->last_error(store);
    return v;
  }
  uint64_t bytes() const {
    uint64_t b = 0;
    EXPECT_EQ(api->bytes_in_use(store, &b), SIEVE_OK);
    return b;
  }
  uint64_t hook_allocations() const { return services->allocation_count() - runner->buffer_allocations(); }
};

// Random tokens of one step (the same bits for every side). Key row i is scaled by salience[i],
// so pages of salient tokens score higher for every head and some pages stop being stamped.
struct StepTokens {
  sieve::HostTensor q, k, v;
  StepTokens(int32_t n, DLDataType dtype, std::mt19937& rng, const std::vector<float>& salience)
      : q({n, 8, 64}, dtype), k({n, 2, 64}, dtype), v({n, 2, 64}, dtype) {
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < q.numel(); ++i) q.set(i, nd(rng));
    for (int64_t i = 0; i < k.numel(); ++i) k.set(i, salience[size_t(i / (2 * 64))] * nd(rng));
    for (int64_t i = 0; i < v.numel(); ++i) v.set(i, nd(rng));
  }
};

// Run one step (every layer, then end_step) on `side` with the given tokens per layer. The CUDA
// side's inputs are uploaded first and the stream is synchronised only after end_step, as a
// decode loop would (it reads the logits back after the step). `after_layer` (CPU side) sees each
// layer's output before end_step evicts; `outputs` receives host copies of them.
using AfterLayer = std::function<void(int32_t layer, DLTensor& out)>;
void run_step(Side& side, uint32_t phase, uint64_t step, const std::vector<int32_t>& qo,
              const std::vector<int32_t>& positions, std::vector<StepTokens>& tokens,
              const AfterLayer& after_layer = {}, std::vector<sieve::HostTensor>* outputs = nullptr) {
  const int32_t n = qo.back();
  sieve::HostTensor qo_host({int64_t(kBatch) + 1}, sieve::kI32);
  for (int32_t b = 0; b <= kBatch; ++b) static_cast<int32_t*>(qo_host.dl().data)[b] = qo[size_t(b)];
  const bool cuda = side.device.device_type == kDLCUDA;
  std::unique_ptr<DeviceCopy> dqo = cuda ? std::make_unique<DeviceCopy>(qo_host.dl()) : nullptr;
  std::vector<sieve::HostTensor> outs;
  std::vector<std::unique_ptr<DeviceCopy>> dev;  // per layer: q, k, v, out
  for (int32_t L = 0; L < kLayers; ++L) {
    outs.emplace_back(std::vector<int64_t>{n, 8, 64}, tokens[size_t(L)].q.dl().dtype);
    if (!cuda) continue;
    for (const sieve::HostTensor* h : {&tokens[size_t(L)].q, &tokens[size_t(L)].k, &tokens[size_t(L)].v, &outs.back()})
      dev.push_back(std::make_unique<DeviceCopy>(h->dl()));
  }
  for (int32_t L = 0; L < kLayers; ++L) {
    StepTokens& t = tokens[size_t(L)];
    LayerInputs in;
    in.layer = L;
    in.phase = phase;
    in.step = step;
    in.batch = kBatch;
    in.seq_ids = side.ids.data();
    in.qo_indptr_host = qo.data();
    in.qo_indptr = cuda ? &dqo->t : &qo_host.dl();
    in.positions_host = positions.data();
    in.q = cuda ? &dev[size_t(L) * 4]->t : &t.q.dl();
    in.k = cuda ? &dev[size_t(L) * 4 + 1]->t : &t.k.dl();
    in.v = cuda ? &dev[size_t(L) * 4 + 2]->t : &t.v.dl();
    DLTensor* out = cuda ? &dev[size_t(L) * 4 + 3]->t : &outs[size_t(L)].dl();
    std::string err;
    ASSERT_EQ(side.runner->run_layer(in, out, &err), SIEVE_OK) << err;
    if (after_layer) after_layer(L, *out);
  }
  std::string err;
  ASSERT_EQ(side.runner->end_step(phase, step, side.ids.data(), kBatch, &err), SIEVE_OK) << err;
  ASSERT_TRUE(side.services->synchronize(&err)) << err;  // before the inputs are freed
  for (int32_t L = 0; cuda && L < kLayers; ++L) {
    ASSERT_EQ(cudaMemcpy(outs[size_t(L)].dl().data, dev[size_t(L) * 4 + 3]->p,
                         size_t(outs[size_t(L)].numel()) * sieve::dtype_bytes(outs[size_t(L)].dl().dtype),
                         cudaMemcpyDeviceToHost), cudaSuccess);
  }
  if (outputs) *outputs = std::move(outs);
}

std::vector<std::vector<int32_t>> rows_of(const SelectionSnapshot& s) {
  std::vector<std::vector<int32_t>> rows;
  for (int32_t r = 0; r < s.n_rows; ++r)
    rows.emplace_back(s.indices.begin() + s.indptr[size_t(r)], s.indices.begin() + s.indptr[size_t(r) + 1]);
  return rows;
}

// The largest |got - ref| over the elements of an output.
double max_error(const sieve::HostTensor& got, const std::vector<double>& ref) {
  double e = 0;
  for (int64_t i = 0; i < got.numel(); ++i) e = std::max(e, std::abs(double(got.get(i)) - ref[size_t(i)]));
  return e;
}

struct Case {
  const char* name;
  DLDataType dtype;
  std::string budget;  // token_budget, pin_prefill
  std::string mode;    // alpha / top_ratio ("" = defaults)
  bool stamps_matter;  // a never-stamping run (alpha = 1) evicts other pages
  int32_t prompt_budget_pages = 0;  // > 0: `budget` sets prefill_policy=quest with this many pages
};

class RaasCuda : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (const std::string why = sieve::testing::cuda_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(RaasCuda, StampsAndEvictsTheSamePagesAsTheCpu) {
  const Case& c = GetParam();
  const std::string chain = "*=raas(" + c.budget + (c.mode.empty() ? "" : ", " + c.mode) + ")";
  const bool prompt_quest = c.prompt_budget_pages > 0;
  Side cpu(sieve::kCpu, c.dtype, chain, prompt_quest), dev(DLDevice{kDLCUDA, 0}, c.dtype, chain, prompt_quest);
  Side fifo(sieve::kCpu, c.dtype, "*=raas(" + c.budget + ", alpha=1)");  // never stamps
  ASSERT_TRUE(cpu.runner && dev.runner && fifo.runner);

  std::mt19937 rng(2026);
  const std::vector<int32_t> prompt = {20, 50, 100};  // ragged: 2, 4 and 7 pinned pages
  const std::vector<int32_t> prompt_pages = {2, 4, 7};
  // The f64 reference's rounding bound: the kernels sum in f32; 16-bit pages may also narrow the
  // softmax weights before P.V (tensor-core operands).
  const double u_weights = c.dtype.bits == 16 ? sieve::tolerance::unit_roundoff(c.dtype) : 0.0;
  int checked_steps = 0;
  std::vector<int32_t> len(kBatch, 0);
  const int decode_steps = 170;
  std::vector<uint64_t> bytes;
  bool differs_from_fifo = false;
  uint64_t allocs_before = 0;
  for (int step = 0; step <= decode_steps; ++step) {
    const uint32_t phase = step == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
    std::vector<int32_t> qo(kBatch + 1, 0), positions;
    std::vector<float> salience;
    for (int32_t b = 0; b < kBatch; ++b) {
      const int32_t add = step == 0 ? prompt[size_t(b)] : 1;
      qo[size_t(b) + 1] = qo[size_t(b)] + add;
      for (int32_t i = 0; i < add; ++i) {
        positions.push_back(len[size_t(b)] + i);
        // Decode pages cycle through three key scales (a page of the largest is attended).
        salience.push_back(step == 0 ? 1.0f : 1.0f - 0.12f * float(((len[size_t(b)] + i) / kPage + b) % 3));
      }
      len[size_t(b)] += add;
    }
    std::vector<StepTokens> tokens;
    for (int32_t L = 0; L < kLayers; ++L) tokens.emplace_back(qo.back(), c.dtype, rng, salience);
    if (step == 2) allocs_before = dev.hook_allocations();
    // prefill_policy=quest, decode: the CPU selection against the reference, then the f64
    // attention of that selection against the CPU output (before end_step evicts).
    std::vector<std::vector<double>> ref_out(kLayers);
    std::vector<double> bound(kLayers, 0.0);
    AfterLayer check_cpu = [&](int32_t L, DLTensor& out) {
      sieve_paged_kv v = cpu.view(L);
      const SelectionSnapshot& snap = cpu.runner->selection_used(L);
      ASSERT_EQ(snap.kind, uint32_t(SIEVE_SEL_BLOCKS)) << "step " << step << ", layer " << L;
      ASSERT_EQ(snap.heads, uint32_t(SIEVE_SEL_PER_Q_HEAD));
      ASSERT_EQ(rows_of(snap), sieve::testing::quest_reference(v, tokens[size_t(L)].q.dl(), 8, c.prompt_budget_pages,
                                                               false, &prompt_pages))
          << "step " << step << ", layer " << L;
      sieve::HostTensor qo_host({int64_t(kBatch) + 1}, sieve::kI32);
      for (int32_t b = 0; b <= kBatch; ++b) static_cast<int32_t*>(qo_host.dl().data)[b] = qo[size_t(b)];
      sieve::runtime::HostSelection sel;
      selection_to_host(snap, &sel);
      sieve_attention_args args = sieve::kernels::make_attention_args(
          SIEVE_PHASE_DECODE, 8, 2, 64, &tokens[size_t(L)].q.dl(), &out, &qo_host.dl(), qo.data(), &v);
      args.selection = sel.get();
      ref_out[size_t(L)] = sieve::reference::attend_reference(args).out;
      bound[size_t(L)] = sieve::tolerance::attention_bound(args, sieve::tolerance::kF32, u_weights).element;
    };
    std::vector<sieve::HostTensor> cpu_out, dev_out;
    const bool check = prompt_quest && phase == SIEVE_PHASE_DECODE;
    run_step(dev, phase, uint64_t(step), qo, positions, tokens, {}, &dev_out);
    if (HasFatalFailure()) return;
    run_step(cpu, phase, uint64_t(step), qo, positions, tokens, check ? check_cpu : AfterLayer{}, &cpu_out);
    if (HasFatalFailure()) return;
    run_step(fifo, phase, uint64_t(step), qo, positions, tokens);
    if (HasFatalFailure()) return;
    for (int32_t L = 0; check && L < kLayers; ++L) {
      ASSERT_EQ(rows_of(dev.runner->selection_used(L)), rows_of(cpu.runner->selection_used(L)))
          << "step " << step << ", layer " << L;
      EXPECT_LE(max_error(cpu_out[size_t(L)], ref_out[size_t(L)]), bound[size_t(L)]) << "CPU, step " << step;
      EXPECT_LE(max_error(dev_out[size_t(L)], ref_out[size_t(L)]), bound[size_t(L)]) << "CUDA, step " << step;
      checked_steps += L == 0;
    }
    for (int32_t L = 0; L < kLayers; ++L)
      for (int32_t b = 0; b < kBatch; ++b) {
        const auto want = cpu.pages(L, b);
        ASSERT_EQ(dev.pages(L, b), want) << c.name << ": step " << step << ", layer " << L << ", sequence " << b;
        differs_from_fifo = differs_from_fifo || fifo.pages(L, b) != want;
      }
    ASSERT_EQ(dev.bytes(), cpu.bytes()) << "step " << step;
    bytes.push_back(dev.bytes());
  }
  EXPECT_EQ(dev.hook_allocations(), allocs_before) << "raas allocated inside its hooks";
  if (c.stamps_matter) {
    EXPECT_TRUE(differs_from_fifo) << "the stamps never changed an eviction";
  }
  EXPECT_EQ(checked_steps, prompt_quest ? decode_steps : 0);
  // After the prompt: 2 + 4 + 7 pages per layer. From step 109 on (the shortest sequence reached
  // 128 tokens) every sequence holds exactly its budget after end_step: resident bytes stop growing.
  // With prefill_policy=quest the budget counts decode pages only, after the pinned prompt pages
  // (the last of which the first decode tokens fill): from step 127 on (the 50-token prompt's
  // sequence reached 64 + 7 x 16 + 1 tokens) each holds its prompt pages + the budget.
  const uint64_t page_bytes = bytes[0] / (uint64_t(kLayers) * 13);
  ASSERT_EQ(bytes[0], page_bytes * kLayers * 13);
  const uint64_t resident = prompt_quest ? 13 + kBatch * kBudgetPages : kBatch * kBudgetPages;
  for (size_t s = prompt_quest ? 128 : 110; s < bytes.size(); ++s)
    ASSERT_EQ(bytes[s], page_bytes * kLayers * resident) << "step " << s << ": not at the budget";
  uint64_t dense_pages = 0;
  for (int32_t b = 0; b < kBatch; ++b) dense_pages += uint64_t(len[size_t(b)] + kPage - 1) / kPage;
  EXPECT_GT(dense_pages * 2, uint64_t(kBatch) * kBudgetPages * 3) << "the run is too short to show the budget";
}

// Runs without a GPU: the CUDA build declares CUDA, with every mode, and refuses a bad option there.
TEST(RaasCudaDescriptor, AcceptsACudaGeometryWithEveryMode) {
  const sieve_geometry g = geometry(sieve::kBF16, DLDevice{kDLCUDA, 0});
  auto resolve = [&](const std::string& text, std::vector<std::string>* errors) {
    const ChainSpec spec = sieve::testing::parse_chain(text);
    ResolvedChains chains;
    return resolve_chains(spec, registry(), g, &chains, errors);
  };
  std::vector<std::string> errors;
  EXPECT_TRUE(resolve("*=raas(token_budget=128, top_ratio=0.1)", &errors)) << (errors.empty() ? "" : errors[0]);
  errors.clear();
  EXPECT_TRUE(resolve("*=raas(token_budget=128, prefill_policy=quest, prefill_budget=64)", &errors))
      << (errors.empty() ? "" : errors[0]);
  // A bad option is refused on CUDA as on the CPU: one line naming it.
  errors.clear();
  EXPECT_FALSE(resolve("*=raas(token_budget=128, prefill_policy=quest, prefill_budget=8)", &errors));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("prefill_budget = 8 is below one page (page_size = 16)"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0].find('\n'), std::string::npos) << errors[0];
}

INSTANTIATE_TEST_SUITE_P(
    Modes, RaasCuda,
    ::testing::Values(Case{"f32_alpha", sieve::kF32, "token_budget=128", "alpha=0.02", true},
                      Case{"bf16_alpha", sieve::kBF16, "token_budget=128", "alpha=0.02", true},
                      Case{"bf16_default_alpha", sieve::kBF16, "token_budget=128", "", false},
                      Case{"f32_top_ratio", sieve::kF32, "token_budget=128", "top_ratio=0.25", true},
                      Case{"bf16_unpinned", sieve::kBF16, "token_budget=128, pin_prefill=false", "alpha=0.05", true},
                      // Prompt budget 3 pages: the 2-page prompt is attended whole, the others by Quest.
                      Case{"f32_prompt_quest", sieve::kF32, "token_budget=128, prefill_policy=quest, prefill_budget=48",
                           "alpha=0.02", true, 3},
                      Case{"bf16_prompt_quest_top_ratio", sieve::kBF16,
                           "token_budget=128, prefill_policy=quest, prefill_budget=48", "top_ratio=0.25", true, 3}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
