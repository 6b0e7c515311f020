// The delta_correction plugin's `diag` tool (`sieve delta-diag` = `sieve tool delta_correction diag`):
// the Δ Attention paper's §4 distribution-shift diagnostic, reproduced. For the
// last queries of a long prefill it compares each chain's layer with all-dense attention, per
// layer:
//   cos       cosine of the attention output o(t, h) with the dense run's, mean (and p10) over
//             (query, head);
//   spearman  Spearman rank correlation of the query's attention row (softmax(q·Kᵀ) over its
//             causal keys) with the dense run's row, mean (and p10) over (query, head).
// Model mode (--prompts FILE, the paper's setting): every chain runs the whole model, so a layer's
// queries and keys carry the drift the sparse prefill caused in the layers below. The rows compared
// are each run's DENSE attention rows for the last --last queries, built from that run's own q and
// K: this is the paper's "last part of the full attention matrix" (its rows are dense in every run;
// they differ only through the shifted q and K). The outputs compared are what the layer really
// produced.
// Synthetic mode (--synthetic N): one layer on a long context with realistic adjacent-key
// similarity (reference/long_context.hpp). With one layer nothing propagates, so q and K are the
// same in every run and the rows above would agree trivially; here the row of a chain is its
// EFFECTIVE attention row: streaming p*(t) (renormalised over the keys it attends, 0 elsewhere),
// recompute p*(t) (dense p(t) at anchors and the tail), Δ p*(t) + p(a) − p*(a) (a = the row's
// anchor; p(t) at anchors and the tail) — the row whose product with V is the output the chain
// computes. Rows compared: the `last` query rows just before the dense tail ([s_p − last, s_p)),
// where the correction does its work, and the output cos also over the last `last` rows.
// The three chains are built from --sink/--window/--gamma/--tail; --chain adds more (model mode
// and synthetic output cos only).
#include <boost/program_options.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sieve/cli/error_line.hpp"
#include "sieve/cli/model_args.hpp"
#include "sieve/cli/parse_options.hpp"
#include "sieve/cli/prompts.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/model/model_chain.hpp"
#include "sieve/model/probe_host.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/cosine.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/reference/statistics.hpp"
#include "sieve/runtime/host_copy.hpp"
#include "sieve/runtime/session.hpp"
#include "sieve/util/error.hpp"
#include "tools/tools.hpp"

namespace po = boost::program_options;

namespace sieve::delta_correction {

using namespace sieve::cli;  // options, the model and prompts every tool shares (core/cli)

namespace {

using reference::spearman;
using reference::Summary;
using reference::summarize;

// What one run leaves for one layer: the compared rows' outputs [rows, hq, d] and attention rows.
struct LayerRows {
  std::vector<float> out;
  std::vector<std::vector<double>> probs;  // [rows * hq]: causal keys of the row
};

// The last `last` queries of every sequence of a prefill probe: their outputs and their dense
// attention rows from this run's own q and resident K.
void capture(const model::LayerProbe& p, const model::ModelConfig& c, int32_t last, LayerRows* into) {
  const int32_t n = p.qo_indptr_host[p.batch];
  const int32_t hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim();
  model::ProbeOnHost host;
  model::probe_to_host(p, c, "delta-diag", &host);
  HostTensor &q = host.q, &out = host.out, &qo = host.qo;
  runtime::HostPagedView& hv = host.cache;
  std::vector<int32_t> rows;
  for (int32_t b = 0; b < p.batch; ++b)
    for (int32_t t = std::max(p.qo_indptr_host[b], p.qo_indptr_host[b + 1] - last); t < p.qo_indptr_host[b + 1]; ++t)
      rows.push_back(t);
  int64_t m = int64_t(rows.size());
  DLTensor rows_t = make_view(rows.data(), kCpu, kI32, 1, &m);
  HostTensor scratch({n, hq, hd}, kF32);
  sieve_attention_args a = kernels::make_attention_args(SIEVE_PHASE_PREFILL, hq, hkv, hd, &q.dl(), &scratch.dl(),
                                                        &qo.dl(), qo.data<int32_t>(), &hv.view);
  a.q_rows = &rows_t;
  reference::RefOptions ro;
  ro.keep_probs = true;
  const reference::RefAttention ref = reference::attend_reference(a, ro);
  for (int32_t t : rows) {
    int32_t b = 0;
    while (p.qo_indptr_host[b + 1] <= t) ++b;
    const int32_t kv_len = kernels::kv_len(hv.view, b);
    const int32_t pos = kv_len - (p.qo_indptr_host[b + 1] - p.qo_indptr_host[b]) + (t - p.qo_indptr_host[b]);
    const float* o = out.data<float>() + int64_t(t) * hq * hd;
    into->out.insert(into->out.end(), o, o + int64_t(hq) * hd);
    for (int32_t h = 0; h < hq; ++h) {
      const auto row = ref.prob_row(t, h);
      into->probs.emplace_back(row.begin(), row.begin() + pos + 1);
    }
  }
}

struct ChainResult {
  std::string chain;
  std::vector<Summary> cos, spearman, cos_last;  // per layer (synthetic: one)
};

nlohmann::json to_json(const Summary& s) { return {{"mean", s.mean}, {"p10", s.p10}, {"n", s.n}}; }

void compare(const LayerRows& dense, const LayerRows& run, int32_t hd, Summary* cos, Summary* spear) {
  std::vector<double> c, s;
  const size_t rows = dense.probs.size();
  for (size_t r = 0; r < rows; ++r) {
    c.push_back(reference::cosine(run.out.data() + r * size_t(hd), dense.out.data() + r * size_t(hd), hd));
    if (spear && r < run.probs.size() && !run.probs[r].empty()) s.push_back(spearman(run.probs[r], dense.probs[r]));
  }
  *cos = summarize(c);
  if (spear) *spear = summarize(s);
}

// ---- model mode ---------------------------------------------------------------------------------
std::vector<ChainResult> run_model(const ModelArgs& ma, const std::string& prompts_file, int32_t last,
                                   const std::vector<std::string>& chains) {
  runtime::Registry registry;
  std::string error;
  if (!discover_plugins(ma, &registry, &error)) fail(SIEVE_ERR_NOT_FOUND, error);
  const model::ModelWeights w = load_model_arg(ma);
  const model::Tokenizer tok = load_tokenizer_arg(ma, w);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& t : read_prompts(prompts_file)) prompts.push_back(tok.encode(t, true, false, w.config.seq_len));
  model::EngineOptions eo;
  if (!engine_options(ma, &eo, &error)) fail(SIEVE_ERR_INVALID_ARGUMENT, error);
  eo.max_batch = int32_t(prompts.size());
  const model::ModelConfig& c = w.config;
  for (const auto& p : prompts)
    require(int32_t(p.size()) <= c.seq_len, SIEVE_ERR_INVALID_ARGUMENT,
            "a prompt of " + std::to_string(p.size()) + " tokens exceeds the model's " + std::to_string(c.seq_len));

  auto run = [&](const std::string& chain) {
    model::Engine engine(w, eo, model::resolve_for_model(chain_arg(chain, ma.kv_store), registry, c, eo));
    std::vector<LayerRows> layers(size_t(c.n_layers));
    engine.set_probe([&](const model::LayerProbe& p) {
      if (p.phase == SIEVE_PHASE_PREFILL) capture(p, c, last, &layers[size_t(p.layer)]);
    });
    std::vector<int32_t> ids;
    for (size_t b = 0; b < prompts.size(); ++b) ids.push_back(engine.add_sequence());
    std::vector<float> logits;
    engine.prefill(ids, prompts, &logits);
    return layers;
  };
  const std::vector<LayerRows> dense = run("");
  std::vector<ChainResult> results;
  for (const auto& chain : chains) {
    const std::vector<LayerRows> got = run(chain);
    ChainResult r;
    r.chain = chain;
    for (int32_t L = 0; L < c.n_layers; ++L) {
      Summary cs, sp;
      compare(dense[size_t(L)], got[size_t(L)], c.head_dim(), &cs, &sp);
      r.cos.push_back(cs);
      r.spearman.push_back(sp);
    }
    results.push_back(r);
  }
  return results;
}

// ---- synthetic mode -----------------------------------------------------------------------------
struct SynthSetup {
  int32_t n = 4096, hq = 8, hkv = 2, d = 64, page = 16, last = 128;
  int64_t gamma = 64, tail = 128;
};

struct SynthRun {
  HostTensor out;                  // [n, hq, d]
  runtime::HostSelection selection;  // the selection the chain's core call used
  runtime::HostPagedView view;
};

SynthRun run_synthetic_chain(const SynthSetup& s, const reference::LongContext& lc, const std::string& chain,
                             const std::string& kv_store, const runtime::Registry& registry) {
  runtime::HostServices services(kCpu);
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 1;
  g.n_q_heads = s.hq;
  g.n_kv_heads = s.hkv;
  g.head_dim = s.d;
  g.page_size = s.page;
  g.max_batch = 1;
  g.max_seq_len = s.n;
  g.kv_dtype = kF32;
  g.device = kCpu;
  g.rope_theta = 10000.f;
  g.rope_dim = s.d;
  runtime::ResolvedChains chains;
  std::vector<std::string> errors;
  const runtime::ChainSpec spec = chain_arg(chain, kv_store);
  if (!runtime::resolve_chains(spec, registry, g, &chains, &errors)) {
    std::string all;
    for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e;
    fail(SIEVE_ERR_INVALID_ARGUMENT, all);
  }
  runtime::Session::Options so;
  so.pages_per_layer = (s.n + s.page - 1) / s.page + 1;
  so.runner.record_selections = true;
  runtime::Session session(services, g, std::move(chains), so);
  int32_t seq = session.add_sequence();

  SynthRun r;
  {
    runtime::LayerRunner& runner = session.runner();
    int64_t qs[3] = {s.n, s.hq, s.d}, ks[3] = {s.n, s.hkv, s.d}, qos[1] = {2};
    std::vector<int32_t> qo = {0, s.n}, pos(size_t(s.n));
    for (int32_t i = 0; i < s.n; ++i) pos[size_t(i)] = i;
    DLTensor q = make_view(const_cast<float*>(lc.q.data()), kCpu, kF32, 3, qs);
    DLTensor k = make_view(const_cast<float*>(lc.k.data()), kCpu, kF32, 3, ks);
    DLTensor v = make_view(const_cast<float*>(lc.v.data()), kCpu, kF32, 3, ks);
    DLTensor qo_t = make_view(qo.data(), kCpu, kI32, 1, qos);
    r.out = HostTensor({s.n, s.hq, s.d}, kF32);
    runtime::LayerInputs in;
    in.layer = 0;
    in.phase = SIEVE_PHASE_PREFILL;
    in.batch = 1;
    in.seq_ids = &seq;
    in.qo_indptr_host = qo.data();
    in.qo_indptr = &qo_t;
    in.positions_host = pos.data();
    in.q = &q;
    in.k = &k;
    in.v = &v;
    std::string error;
    if (runner.run_layer(in, &r.out.dl(), &error) != SIEVE_OK) fail(SIEVE_ERR_INTERNAL, chain + ": " + error);
    runtime::selection_to_host(runner.selection_used(0), &r.selection);
  }
  runtime::copy_view_to_host(services, session.view(0, &seq, 1), &r.view);
  return r;
}

std::vector<ChainResult> run_synthetic(const SynthSetup& s, const std::string& sparse_chain,
                                       const std::vector<std::string>& extra, const ModelArgs& ma) {
  runtime::Registry registry;
  std::string error;
  if (!discover_plugins(ma, &registry, &error)) fail(SIEVE_ERR_NOT_FOUND, error);
  reference::LongContextSpec ls;
  ls.n_q_heads = s.hq;
  ls.n_kv_heads = s.hkv;
  ls.head_dim = s.d;
  ls.n_tokens = s.n;
  const reference::LongContext lc = reference::make_long_context(ls);

  // Rows compared: [s_p − last, s_p) (the rule of correction_rows.hpp), and the last `last` rows.
  const int64_t s_p = std::max<int64_t>(0, s.n - (s.n % s.gamma + std::max(s.tail, s.gamma)));
  const int32_t probe0 = int32_t(std::max<int64_t>(0, s_p - s.last));
  std::vector<int32_t> probe, tail_rows;
  for (int32_t t = probe0; t < s_p; ++t) probe.push_back(t);
  for (int32_t t = std::max(0, s.n - s.last); t < s.n; ++t) tail_rows.push_back(t);
  auto anchor_of = [&](int32_t t) { return int32_t(t - t % s.gamma); };
  std::vector<int32_t> needed = probe;  // rows whose dense/sparse probabilities are needed
  for (int32_t t : probe) needed.push_back(anchor_of(t));
  std::sort(needed.begin(), needed.end());
  needed.erase(std::unique(needed.begin(), needed.end()), needed.end());

  const SynthRun dense = run_synthetic_chain(s, lc, "", ma.kv_store, registry);
  // Probabilities of the needed rows under a run's selection (dense when it has none).
  auto probs_of = [&](const SynthRun& run, bool use_selection) {
    HostTensor q({s.n, s.hq, s.d}, kF32), scratch({s.n, s.hq, s.d}, kF32), qo({2}, kI32);
    std::memcpy(q.dl().data, lc.q.data(), q.nbytes());
    qo.data<int32_t>()[0] = 0;
    qo.data<int32_t>()[1] = s.n;
    sieve_attention_args a = kernels::make_attention_args(SIEVE_PHASE_PREFILL, s.hq, s.hkv, s.d, &q.dl(),
                                                          &scratch.dl(), &qo.dl(), qo.data<int32_t>(), &run.view.view);
    if (use_selection) a.selection = run.selection.get();
    std::vector<int32_t> rows = needed;
    int64_t m = int64_t(rows.size());
    DLTensor rt = make_view(rows.data(), kCpu, kI32, 1, &m);
    a.q_rows = &rt;
    reference::RefOptions ro;
    ro.keep_probs = true;
    return reference::attend_reference(a, ro);
  };
  const reference::RefAttention p_dense = probs_of(dense, false);
  auto rows_of = [&](const SynthRun& run, const std::vector<int32_t>& rows) {
    LayerRows lr;
    for (int32_t t : rows) {
      const float* o = run.out.data<float>() + int64_t(t) * s.hq * s.d;
      lr.out.insert(lr.out.end(), o, o + int64_t(s.hq) * s.d);
    }
    return lr;
  };
  LayerRows dense_probe = rows_of(dense, probe), dense_last = rows_of(dense, tail_rows);
  for (int32_t t : probe)
    for (int32_t h = 0; h < s.hq; ++h) {
      const auto row = p_dense.prob_row(t, h);
      dense_probe.probs.emplace_back(row.begin(), row.begin() + t + 1);
    }
  dense_last.probs.resize(tail_rows.size() * size_t(s.hq));

  // The three chains of the paper's figure, then any extra one (outputs only).
  const std::string window_chain = "prefill:*=" + sparse_chain;
  const std::string dc = "delta_correction(gamma=" + std::to_string(s.gamma) + ",tail=" + std::to_string(s.tail);
  struct Named {
    std::string chain;
    int kind;  // 0 sparse, 1 recompute, 2 delta, 3 other
  };
  std::vector<Named> runs = {{window_chain, 0}, {window_chain + ">" + dc + ",mode=recompute)", 1},
                             {window_chain + ">" + dc + ")", 2}};
  for (const auto& e : extra) runs.push_back({e, 3});
  std::vector<ChainResult> results;
  reference::RefAttention p_sparse;
  bool have_sparse = false;
  for (const auto& nr : runs) {
    const SynthRun run = run_synthetic_chain(s, lc, nr.chain, ma.kv_store, registry);
    if (nr.kind == 0) {
      p_sparse = probs_of(run, true);
      have_sparse = true;
    }
    LayerRows probe_rows = rows_of(run, probe), last_rows = rows_of(run, tail_rows);
    last_rows.probs.resize(tail_rows.size() * size_t(s.hq));
    if (nr.kind <= 2 && have_sparse)
      for (int32_t t : probe)
        for (int32_t h = 0; h < s.hq; ++h) {
          const int32_t a = anchor_of(t);
          const auto ps = p_sparse.prob_row(t, h), pd = p_dense.prob_row(t, h);
          const auto pa = p_dense.prob_row(a, h), psa = p_sparse.prob_row(a, h);
          std::vector<double> eff(size_t(t) + 1);
          for (int32_t j = 0; j <= t; ++j) {
            if (t == a && nr.kind >= 1) eff[size_t(j)] = pd[size_t(j)];
            else if (nr.kind == 2) eff[size_t(j)] = ps[size_t(j)] + pa[size_t(j)] - psa[size_t(j)];
            else eff[size_t(j)] = ps[size_t(j)];
          }
          probe_rows.probs.push_back(std::move(eff));
        }
    ChainResult r;
    r.chain = nr.chain;
    Summary cs, sp, cl;
    compare(dense_probe, probe_rows, s.d, &cs, nr.kind <= 2 ? &sp : nullptr);
    compare(dense_last, last_rows, s.d, &cl, nullptr);
    r.cos.push_back(cs);
    if (nr.kind <= 2) r.spearman.push_back(sp);
    r.cos_last.push_back(cl);
    results.push_back(r);
  }
  return results;
}

}  // namespace

int diag_main(int argc, const char* const* argv) {
  const std::string cmd = argv[0];  // the command as typed: `sieve delta-diag` or `sieve tool delta_correction diag`
  po::options_description opts(
      cmd + ": output cosine and attention-row Spearman of sparse / recompute / Δ prefill vs dense, per layer");
  ModelArgs ma;
  std::string prompts_file, json_file;
  std::vector<std::string> extra;
  int32_t last = 128, sink = 4, window = 32, synthetic = 0;
  int64_t gamma = 8, tail = 16;
  SynthSetup ss;
  opts.add_options()("help,h", "this help")
      ("model", po::value(&ma.model), "model (as sieve run); default: the embedded stories260K")
      ("tokenizer", po::value(&ma.tokenizer), "llama2.c tokenizer file")
      ("prompts", po::value(&prompts_file), "model mode: one long prompt per line (all prefilled as one batch)")
      ("synthetic", po::value(&synthetic), "synthetic mode: one layer on a long context of N tokens")
      ("hq", po::value(&ss.hq)->default_value(8), "synthetic: query heads")
      ("hkv", po::value(&ss.hkv)->default_value(2), "synthetic: KV heads")
      ("d", po::value(&ss.d)->default_value(64), "synthetic: head dim")
      ("last", po::value(&last)->default_value(128), "queries compared (the paper: the last 128)")
      ("sink", po::value(&sink)->default_value(4), "streaming sink tokens")
      ("window", po::value(&window)->default_value(32), "streaming window")
      ("gamma", po::value(&gamma)->default_value(8), "delta_correction gamma")
      ("tail", po::value(&tail)->default_value(16), "delta_correction tail")
      ("chain", po::value(&extra), "an extra chain to compare (repeatable)")
      ("page-size", po::value(&ma.page_size)->default_value(16), "tokens per KV page")
      ("plugin-dir", po::value(&ma.plugin_dirs), "extra plugin directory (searched first; repeatable)")
      ("json", po::value(&json_file), "also write the results as JSON to this file");
  add_kv_store_option(opts, &ma.kv_store);
  po::variables_map vm;
  if (const auto done = parse_options(cmd.c_str(), opts, argc, argv, &vm)) return *done;
  if (prompts_file.empty() == (synthetic == 0)) {
    return report_error(cmd, "give exactly one of --prompts FILE (model) or --synthetic N", 2);
  }
  if (last < 1 || window < 1 || sink < 0 || gamma < 1 || tail < 0 || synthetic < 0) {
    return report_error(cmd, "--last, --window, --gamma must be >= 1; --sink, --tail >= 0", 2);
  }
  const std::string sparse = "streaming(sink=" + std::to_string(sink) + ",window=" + std::to_string(window) + ")";
  const std::string dc = "delta_correction(gamma=" + std::to_string(gamma) + ",tail=" + std::to_string(tail);
  try {
    std::vector<ChainResult> results;
    if (synthetic > 0) {
      ss.n = synthetic;
      ss.page = ma.page_size;
      ss.last = last;
      ss.gamma = gamma;
      ss.tail = tail;
      results = run_synthetic(ss, sparse, extra, ma);
    } else {
      std::vector<std::string> chains = {"prefill:*=" + sparse, "prefill:*=" + sparse + ">" + dc + ",mode=recompute)",
                                         "prefill:*=" + sparse + ">" + dc + ")"};
      chains.insert(chains.end(), extra.begin(), extra.end());
      results = run_model(ma, prompts_file, last, chains);
    }
    nlohmann::json j = {{"mode", synthetic > 0 ? "synthetic" : "model"}, {"last", last}};
    if (synthetic > 0)
      j["synthetic"] = {{"tokens", ss.n}, {"hq", ss.hq}, {"hkv", ss.hkv}, {"d", ss.d}, {"page", ss.page},
                        {"generator", "reference/long_context.hpp defaults"}};
    else
      j["prompts_file"] = prompts_file;
    std::printf("%-6s %-9s %-9s %-9s %-9s %-9s  %s\n", "layer", "cos", "cos p10", "spearman", "spear p10",
                synthetic > 0 ? "cos last" : "", "chain");
    for (const auto& r : results) {
      nlohmann::json jr = {{"chain", r.chain}};
      for (size_t L = 0; L < r.cos.size(); ++L) {
        nlohmann::json jl = {{"layer", L}, {"cos", to_json(r.cos[L])}};
        char sp[64] = "        -         -";
        if (L < r.spearman.size()) {
          std::snprintf(sp, sizeof sp, "%9.4f %9.4f", r.spearman[L].mean, r.spearman[L].p10);
          jl["spearman"] = to_json(r.spearman[L]);
        }
        char cl[32] = "";
        if (L < r.cos_last.size()) {
          std::snprintf(cl, sizeof cl, "%9.4f", r.cos_last[L].mean);
          jl["cos_last"] = to_json(r.cos_last[L]);
        }
        std::printf("%-6zu %9.4f %9.4f %s %-9s  %s\n", L, r.cos[L].mean, r.cos[L].p10, sp, cl, r.chain.c_str());
        jr["layers"].push_back(jl);
      }
      j["chains"].push_back(jr);
    }
    if (synthetic > 0)
      std::printf("\nsynthetic: cos/spearman over the %d query rows before the dense tail (effective attention rows,"
                  " see --help text in the source); cos last: the last %d rows\n", last, last);
    else
      std::printf("\nmodel: the last %d queries of each prompt; spearman of each run's dense attention rows (own q, K)"
                  " against the dense run's\n", last);
    if (!json_file.empty()) {
      std::ofstream f(json_file);
      if (!f) fail(SIEVE_ERR_INVALID_ARGUMENT, "cannot write " + json_file);
      f << j.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    return report_error(cmd, e.what(), 1);
  }
  return 0;
}

}  // namespace sieve::delta_correction
