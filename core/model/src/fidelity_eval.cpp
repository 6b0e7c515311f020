#include "sieve/runtime/host_copy.hpp"
#include "sieve/model/fidelity_eval.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/model/probe_host.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/util/error.hpp"

namespace sieve::model {

namespace {

using clock = std::chrono::steady_clock;
double since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

// Greedy (or teacher-forced) generation of exactly `steps` positions per prompt, all prompts
// as one batch. logits[b][i] are the next-token logits at position i (after the prefill for i = 0,
// after feeding token i-1 otherwise); tokens[b][i] their argmax. With `forced`, token i-1 fed is
// forced[b][i-1] instead of the model's own.
struct GreedyRun {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<std::vector<float>>> logits;  // only when keep_logits
  uint64_t kv_bytes = 0;
  double seconds = 0;
};

GreedyRun run_greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts, int32_t steps,
                     const std::vector<std::vector<int32_t>>* forced, bool keep_logits,
                     const std::function<void(Engine&, const std::vector<int32_t>&)>& before_remove) {
  const size_t B = prompts.size();
  const int32_t V = engine.config().vocab_size;
  GreedyRun r;
  r.tokens.assign(B, {});
  if (keep_logits) r.logits.assign(B, {});
  std::vector<int32_t> ids;
  for (size_t b = 0; b < B; ++b) ids.push_back(engine.add_sequence());
  struct Remove {
    Engine& e;
    std::vector<int32_t>& ids;
    ~Remove() {
      for (int32_t id : ids) try {
          e.remove_sequence(id);
        } catch (...) {
        }
    }
  } remove{engine, ids};
  std::vector<float> logits;
  auto t0 = clock::now();
  auto take = [&]() {
    for (size_t b = 0; b < B; ++b) {
      std::span<const float> row(logits.data() + b * size_t(V), size_t(V));
      r.tokens[b].push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
      if (keep_logits) r.logits[b].emplace_back(row.begin(), row.end());
    }
  };
  engine.prefill(ids, prompts, &logits);
  take();
  std::vector<int32_t> feed(B);
  for (int32_t i = 1; i < steps; ++i) {
    for (size_t b = 0; b < B; ++b) feed[b] = forced ? (*forced)[b][size_t(i) - 1] : r.tokens[b][size_t(i) - 1];
    engine.decode(ids, feed, &logits);
    take();
  }
  r.seconds = since(t0);
  r.kv_bytes = engine.kv_bytes();
  if (before_remove) before_remove(engine, ids);
  return r;
}

// The f64 probabilities one block of query rows may hold at once: a 16K-token prefill's rows
// all together would need gigabytes (rows x heads x keys doubles).
constexpr int64_t kProbBudget = int64_t(1) << 23;

// One layer call measured against the f64 dense reference on the same inputs, in blocks of query
// rows (the reference's q_rows) so that memory stays bounded at any context length.
void measure(const LayerProbe& p, const ModelConfig& c, AttentionFidelity* acc) {
  const int32_t n = p.qo_indptr_host[p.batch];
  if (n == 0) return;
  const int32_t hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim();
  ProbeOnHost host;
  probe_to_host(p, c, "eval", &host);
  HostTensor &q = host.q, &out = host.out, &qo = host.qo;
  runtime::HostPagedView& hv = host.cache;
  runtime::HostSelection sel;
  runtime::selection_to_host(p.runner->selection_used(p.layer), &sel);

  sieve_attention_args args = kernels::make_attention_args(p.phase, hq, hkv, hd, &q.dl(), &out.dl(), &qo.dl(),
                                                           qo.data<int32_t>(), &hv.view);
  args.selection = sel.get();

  reference::RefOptions ro;
  ro.ignore_selection = true;
  ro.keep_probs = true;
  int32_t keys = 1;  // the most keys a row can see: the furthest position + 1
  for (int32_t t = 0; t < n; ++t) keys = std::max(keys, p.positions_host[t] + 1);
  const int32_t block = int32_t(std::clamp<int64_t>(kProbBudget / (int64_t(hq) * keys), 1, n));
  const float* o = out.data<float>();
  for (int32_t first = 0; first < n; first += block) {
    const int32_t m = std::min(block, n - first);
    HostTensor rows({m}, kI32);
    for (int32_t i = 0; i < m; ++i) rows.data<int32_t>()[i] = first + i;
    args.q_rows = &rows.dl();
    const reference::RefAttention ref = reference::attend_reference(args, ro);
    for (int32_t t = first; t < first + m; ++t)
      for (int32_t h = 0; h < hq; ++h) {
        const std::span<const double> want = ref.out_row(t, h);
        const float* got = o + (int64_t(t) * hq + h) * hd;
        for (int32_t i = 0; i < hd; ++i) {
          const double d = double(got[i]) - want[size_t(i)];
          acc->err_sq += d * d;
          acc->ref_sq += want[size_t(i)] * want[size_t(i)];
        }
        // Recall (reference::attention_recall's definition, from the same dense probabilities):
        // the dense softmax mass on the keys the selection attends.
        const auto probs = ref.prob_row(t, h);
        const auto causal = ref.attended_row(t, h);
        const std::vector<uint8_t> sel_mask = reference::attended_keys(args, t, h);
        double mass = 0, total = 0;
        int64_t attended = 0, seen = 0;
        for (size_t j = 0; j < probs.size(); ++j) {
          total += probs[j];
          if (sel_mask[j]) mass += probs[j], ++attended;
          seen += causal[j];
        }
        // A row that attends every causal key has recall 1 by definition (not a rounded sum).
        const double recall = attended == seen ? 1.0 : mass;
        acc->recall_sum += recall;
        acc->min_recall = std::min(acc->min_recall, attended == seen ? 1.0 : total > 0 ? mass / total : 1.0);
        acc->attended_sum += seen ? double(attended) / double(seen) : 1.0;
        ++acc->rows;
      }
  }
}

void finish(AttentionFidelity* a) {
  if (a->rows > 0) {
    a->recall = a->recall_sum / double(a->rows);
    a->attended = a->attended_sum / double(a->rows);
  }
  a->out_rel_err = a->ref_sq > 0 ? std::sqrt(a->err_sq / a->ref_sq) : std::sqrt(a->err_sq);
}

void merge(AttentionFidelity* into, const AttentionFidelity& a) {
  into->rows += a.rows;
  into->recall_sum += a.recall_sum;
  into->attended_sum += a.attended_sum;
  into->err_sq += a.err_sq;
  into->ref_sq += a.ref_sq;
  into->min_recall = std::min(into->min_recall, a.min_recall);
}

}  // namespace

double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits) {
  auto log_softmax = [](std::span<const float> x) {
    const double mx = *std::max_element(x.begin(), x.end());
    double sum = 0;
    for (float v : x) sum += std::exp(double(v) - mx);
    const double lse = mx + std::log(sum);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = double(x[i]) - lse;
    return out;
  };
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(kl, 0.0);  // rounding can leave -1e-17 for identical inputs
}

EvalReport evaluate_fidelity(const ModelWeights& weights, const std::vector<std::vector<int32_t>>& prompts,
                             const runtime::ChainSpec& chain, const runtime::Registry& registry,
                             const EvalOptions& options) {
  require(!prompts.empty(), SIEVE_ERR_INVALID_ARGUMENT, "eval: no prompt");
  require(options.steps >= 1, SIEVE_ERR_INVALID_ARGUMENT, "eval: steps must be >= 1");
  const ModelConfig& c = weights.config;
  EngineOptions eo = options.engine;
  eo.max_batch = int32_t(prompts.size());
  const int32_t max_len = eo.max_seq_len > 0 ? eo.max_seq_len : c.seq_len;
  for (const auto& p : prompts) {
    require(!p.empty(), SIEVE_ERR_INVALID_ARGUMENT, "eval: an empty prompt");
    require(int64_t(p.size()) + options.steps - 1 <= max_len, SIEVE_ERR_INVALID_ARGUMENT,
            "eval: a prompt of " + std::to_string(p.size()) + " tokens + " + std::to_string(options.steps) +
                " steps exceeds the model's " + std::to_string(max_len) + " positions");
  }
  const bool task = !options.continuations.empty();
  if (task) {
    require(options.continuations.size() == prompts.size(), SIEVE_ERR_INVALID_ARGUMENT,
            "eval: " + std::to_string(options.continuations.size()) + " continuations for " +
                std::to_string(prompts.size()) + " prompts");
    for (const auto& cont : options.continuations)
      require(int64_t(cont.size()) >= options.steps - 1, SIEVE_ERR_INVALID_ARGUMENT,
              "eval: a continuation of " + std::to_string(cont.size()) + " tokens for " +
                  std::to_string(options.steps) + " steps");
  }
  // What the dense run and the measured chain run feed after the prompt: the task's tokens, or
  // (nullptr) the dense run's own greedy tokens.
  const std::vector<std::vector<int32_t>>* fed = task ? &options.continuations : nullptr;
  // The KV pool and the plugins' scratch are sized for what runs, not for the model's
  // max_position_embeddings (a config may say 2^31).
  if (eo.max_seq_len <= 0) {
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    eo.max_seq_len = int32_t(std::min<int64_t>(max_len, int64_t(longest) + options.steps - 1));
  }
  const size_t B = prompts.size();
  const int32_t N = options.steps;

  EvalReport rep;
  rep.chain = runtime::to_string(chain);
  rep.device = device_name(eo.device);
  rep.prompts = int32_t(B);
  rep.steps = N;
  rep.prompt_tokens = prompts;
  rep.attention_measured = options.measure_attention;

  // 1. Dense: no chain, the core's dense kernel everywhere, on the chain's KV store.
  GreedyRun dense;
  {
    runtime::ChainSpec dense_spec;
    dense_spec.kv_store = chain.kv_store;
    Engine engine(weights, eo, resolve_for_model(dense_spec, registry, c, eo));
    // Untimed warm-up (thread pools, first-touch pages, CUDA context), so the dense and the chain
    // timings below both run warm.
    run_greedy(engine, prompts, std::min(N, 4), fed, false, nullptr);
    dense = run_greedy(engine, prompts, N, fed, true, nullptr);
  }
  rep.dense_tokens = dense.tokens;
  rep.kv_bytes_dense = dense.kv_bytes;
  rep.dense_seconds = dense.seconds;

  // 2. The chain, teacher-forced on the dense tokens, every attention call measured.
  std::vector<LayerFidelity> layers(size_t(c.n_layers));
  for (int32_t L = 0; L < c.n_layers; ++L) layers[size_t(L)].layer = L;
  {
    EngineOptions mo = eo;
    mo.record_selections = options.measure_attention;
    Engine engine(weights, mo, resolve_for_model(chain, registry, c, mo));
    if (options.measure_attention) {
      engine.set_probe([&](const LayerProbe& p) {
        LayerFidelity& lf = layers[size_t(p.layer)];
        measure(p, c, p.phase == SIEVE_PHASE_PREFILL ? &lf.prefill : &lf.decode);
      });
    }
    auto t0 = clock::now();
    GreedyRun forced = run_greedy(engine, prompts, N, task ? fed : &dense.tokens, true, [&](Engine& e, const std::vector<int32_t>& ids) {
      // Resident tokens per layer against tokens fed (eviction shows here).
      int64_t fed = 0;
      for (int32_t id : ids) fed += e.seq_len(id);
      for (int32_t L = 0; L < c.n_layers; ++L) {
        int64_t resident = 0;
        for (int32_t id : ids) resident += e.resident_tokens(L, id);
        layers[size_t(L)].resident_fraction = fed > 0 ? double(resident) / double(fed) : 1.0;
      }
    });
    rep.measure_seconds = since(t0);
    rep.metrics = engine.services().metrics();
    double kl_sum = 0;
    int64_t agree = 0;
    for (size_t b = 0; b < B; ++b)
      for (int32_t i = 0; i < N; ++i) {
        const auto& pd = dense.logits[b][size_t(i)];
        const auto& pc = forced.logits[b][size_t(i)];
        const double kl = kl_divergence(pd, pc);
        kl_sum += kl;
        rep.kl_max = std::max(rep.kl_max, kl);
        agree += forced.tokens[b][size_t(i)] == dense.tokens[b][size_t(i)];
      }
    rep.chain_forced_tokens = forced.tokens;
    if (task) rep.kv_bytes_chain = forced.kv_bytes;  // run 3, which has it otherwise, is skipped
    rep.positions = int64_t(B) * N;
    rep.kl_mean = kl_sum / double(rep.positions);
    rep.top1_agreement = double(agree) / double(rep.positions);
  }
  for (auto& lf : layers) {
    finish(&lf.prefill);
    finish(&lf.decode);
    merge(&rep.prefill, lf.prefill);
    merge(&rep.decode, lf.decode);
  }
  finish(&rep.prefill);
  finish(&rep.decode);
  rep.layers = std::move(layers);

  // 3. The chain, free-running (not for a task: its answer is graded teacher-forced above).
  rep.free_running = !task;
  if (!task) {
    Engine engine(weights, eo, resolve_for_model(chain, registry, c, eo));
    GreedyRun free = run_greedy(engine, prompts, N, nullptr, false, nullptr);
    rep.chain_tokens = free.tokens;
    rep.kv_bytes_chain = free.kv_bytes;
    rep.chain_seconds = free.seconds;
    int64_t agree = 0;
    for (size_t b = 0; b < B; ++b) {
      int32_t first = -1;
      for (int32_t i = 0; i < N; ++i) {
        const bool same = free.tokens[b][size_t(i)] == dense.tokens[b][size_t(i)];
        agree += same;
        if (!same && first < 0) first = i;
      }
      rep.first_divergence.push_back(first);
    }
    rep.token_agreement = double(agree) / double(int64_t(B) * N);
  }
  return rep;
}

}  // namespace sieve::model
