// The delta plugin's `calibrate` tool (`sieve calibrate delta` = `sieve tool delta calibrate`):
// which layers should be DELTA's Δ-layers (paper 000 §5, "Layer
// configuration": the Δ-layers "correspond to points showing the largest average shift in
// attention distributions across decoding steps, marking transitions where salient-token sets
// change most rapidly").
//
// The model decodes greedily with dense attention (no chain) from each prompt; after every decode
// layer the engine's probe hands over the layer's queries and cache, and the layer's attention is
// recomputed on the host in f64 (reference::attend_reference). Per layer i, decode step t,
// sequence b and query head h, with α = the head's softmax over the resident keys:
//   shift     TV_h(t) = ½ Σ_{j < n_{t-1}} | α_h^t(j) / Z − α_h^{t-1}(j) |,  Z = Σ_{j < n_{t-1}} α_h^t(j)
//             (total variation between consecutive steps over the keys both steps saw; the new
//             key of step t is left out and α^t renormalised), averaged over (t, b, h);
//   turnover  1 − |ρ_t ∩ ρ_{t-1}| / |ρ_t| for DELTA's own choice ρ of earlier pages at this layer
//             (top K/P − window pages by S_u = Σ_{t in u} max_h α_h(t), the recency window left
//             out), over the steps where the sequence exceeds the budget at both steps.
// Suggestion: dense_layers = the first --dense layers (the paper keeps [0,1] dense); Δ-layers =
// the first layer after them (sparse layers need a selection before them) plus the --select − 1
// other layers of largest shift.
#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "tools/tools.hpp"
#include "sieve/cli/model_args.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/cli/parse_options.hpp"
#include "sieve/model/probe_host.hpp"
#include "sieve/cli/prompts.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/model/engine.hpp"
#include "sieve/model/model_chain.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/runtime/host_copy.hpp"
#include "sieve/selection/top_k.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/printable.hpp"

namespace po = boost::program_options;

namespace sieve::delta {

using namespace sieve::cli;  // options, the model and prompts every tool shares (core/cli)

namespace {

struct LayerShift {
  double tv_sum = 0;
  int64_t tv_rows = 0;
  double turnover_sum = 0;
  int64_t turnover_rows = 0;
  double tv() const { return tv_rows ? tv_sum / double(tv_rows) : 0; }
  double turnover() const { return turnover_rows ? turnover_sum / double(turnover_rows) : 0; }
};

// What the previous decode step left, per (layer, sequence).
struct Previous {
  bool valid = false;
  std::vector<std::vector<double>> probs;  // [head] -> α over the keys of that step
  std::vector<int32_t> chosen;             // earlier pages DELTA chose (ascending)
  bool over_budget = false;
};

struct Study {
  int32_t page_size = 16, budget_pages = 4;
  int64_t recent = 8;
  std::vector<LayerShift> layers;
  std::vector<std::vector<Previous>> prev;  // [layer][batch position]
};

// DELTA's earlier pages for one sequence (the window pages excluded): top (budget − window)
// pages by S_u, deterministic ties (core/selection).
std::vector<int32_t> chosen_pages(const std::vector<double>& page_score, int32_t len, const Study& s,
                                  bool* over_budget) {
  const int32_t P = s.page_size, n = int32_t(page_score.size());
  const int64_t first_recent = len > s.recent ? len - s.recent : 0;
  const int32_t window = n - int32_t(first_recent / P);
  const int32_t k = std::max(0, s.budget_pages - window);
  *over_budget = n > s.budget_pages;
  if (!*over_budget) return {};
  std::vector<float> scores(page_score.begin(), page_score.end());
  std::vector<int32_t> out(static_cast<size_t>(n)), scratch(static_cast<size_t>(n));
  const int32_t m = selection::top_k_row({n, 0, window, k}, scores.data(), 1, out.data(), scratch.data());
  out.resize(size_t(m));
  out.erase(std::remove_if(out.begin(), out.end(), [&](int32_t u) { return u >= n - window; }), out.end());
  return out;
}

void measure(const model::LayerProbe& p, const model::ModelConfig& c, Study& s) {
  if (p.phase != SIEVE_PHASE_DECODE || p.batch == 0) return;
  const int32_t n = p.qo_indptr_host[p.batch];
  const int32_t hq = c.n_heads, hkv = c.n_kv_heads, hd = c.head_dim();
  HostTensor q({n, hq, hd}, kF32), out({n, hq, hd}, kF32), qo({p.batch + 1}, kI32);
  runtime::copy_to_host(*p.services, q.dl().data, *p.q, q.nbytes());
  std::memcpy(qo.data<int32_t>(), p.qo_indptr_host, size_t(p.batch + 1) * 4);
  runtime::HostPagedView hv;
  model::probe_cache_to_host(p, "calibrate", &hv);
  sieve_attention_args args = kernels::make_attention_args(p.phase, hq, hkv, hd, &q.dl(), &out.dl(), &qo.dl(),
                                                           qo.data<int32_t>(), &hv.view);
  reference::RefOptions ro;
  ro.keep_probs = true;
  const reference::RefAttention ref = reference::attend_reference(args, ro);

  LayerShift& acc = s.layers[size_t(p.layer)];
  auto& prev_of_layer = s.prev[size_t(p.layer)];
  if (prev_of_layer.size() < size_t(p.batch)) prev_of_layer.resize(size_t(p.batch));
  for (int32_t b = 0; b < p.batch; ++b) {
    const int32_t t = p.qo_indptr_host[b];  // the sequence's one decode query
    Previous& prev = prev_of_layer[size_t(b)];
    const int32_t len = int32_t(ref.prob_row(t, 0).size());
    std::vector<std::vector<double>> probs(static_cast<size_t>(hq));
    std::vector<double> token_max(static_cast<size_t>(len), 0.0);
    for (int32_t h = 0; h < hq; ++h) {
      const auto row = ref.prob_row(t, h);
      probs[size_t(h)].assign(row.begin(), row.end());
      for (int32_t j = 0; j < len; ++j) token_max[size_t(j)] = std::max(token_max[size_t(j)], row[size_t(j)]);
      if (prev.valid && prev.probs[size_t(h)].size() < size_t(len)) {
        const auto& old = prev.probs[size_t(h)];
        double z = 0, tv = 0;
        for (size_t j = 0; j < old.size(); ++j) z += row[j];
        if (z > 0) {
          for (size_t j = 0; j < old.size(); ++j) tv += std::abs(row[j] / z - old[j]);
          acc.tv_sum += 0.5 * tv;
          ++acc.tv_rows;
        }
      }
    }
    const int32_t n_pages = (len + s.page_size - 1) / s.page_size;
    std::vector<double> page_score(static_cast<size_t>(n_pages), 0.0);
    for (int32_t j = 0; j < len; ++j) page_score[size_t(j / s.page_size)] += token_max[size_t(j)];
    bool over = false;
    std::vector<int32_t> chosen = chosen_pages(page_score, len, s, &over);
    if (prev.valid && over && prev.over_budget && !chosen.empty()) {
      size_t common = 0;
      for (int32_t u : chosen) common += std::binary_search(prev.chosen.begin(), prev.chosen.end(), u);
      acc.turnover_sum += 1.0 - double(common) / double(chosen.size());
      ++acc.turnover_rows;
    }
    prev.valid = true;
    prev.probs = std::move(probs);
    prev.chosen = std::move(chosen);
    prev.over_budget = over;
  }
}

std::string list_text(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

}  // namespace

int calibrate_main(int argc, const char* const* argv) {
  const std::string cmd = argv[0];  // the command as typed: `sieve calibrate delta` or `sieve tool delta calibrate`
  po::options_description opts(
      cmd + ": per-layer shift of the attention between consecutive decode steps\n"
      "(dense greedy decoding, attention recomputed in f64); suggests DELTA's Δ-layers");
  ModelArgs ma;
  std::string prompts_file;
  int32_t steps = 128, n_dense = 2, n_select = 0;
  int64_t budget = 64, recent = 8;
  opts.add_options()("help,h", "this help")
      ("model", po::value(&ma.model), "model file or directory (as sieve run); default: the embedded stories260K")
      ("tokenizer", po::value(&ma.tokenizer), "llama2.c tokenizer file (as sieve run)")
      ("prompts", po::value(&prompts_file), "file with one prompt per line; default: 4 built-in prompts")
      ("steps", po::value(&steps)->default_value(128), "decode steps per prompt")
      ("device", po::value(&ma.device)->default_value("cpu"), "cpu | cuda[:N]")
      ("page-size", po::value(&ma.page_size)->default_value(16), "tokens per KV page: 16, 32 or 64")
      ("token-budget", po::value(&budget)->default_value(64), "K for the page-turnover column (a multiple of the page size)")
      ("recent", po::value(&recent)->default_value(8), "L for the page-turnover column")
      ("dense", po::value(&n_dense)->default_value(2), "leading layers suggested dense")
      ("select", po::value(&n_select)->default_value(0), "Δ-layers to suggest (0: 3 for >= 16 layers, 2 for >= 8, else 1)")
      ("json", "print JSON instead of a table");
  add_kv_store_option(opts, &ma.kv_store);
  po::variables_map vm;
  if (const auto done = parse_options(cmd.c_str(), opts, argc, argv, &vm)) return *done;
  std::string error;
  model::EngineOptions eo;
  if (!engine_options(ma, &eo, &error)) {
    return report_error(cmd, error, 2);
  }
  if (steps < 2) {
    return report_error(cmd, "--steps must be >= 2 (shifts are between steps), got " + std::to_string(steps), 2);
  }
  if (recent < 1 || budget < recent || budget % eo.page_size != 0) {
    return report_error(cmd, "--token-budget " + std::to_string(budget) + " must be a multiple of the page size " +
                                 std::to_string(eo.page_size) + " and >= --recent " + std::to_string(recent) + " >= 1",
                        2);
  }
  const bool json = vm.count("json") > 0;
  try {
    const model::ModelWeights w = load_model_arg(ma);
    const model::Tokenizer tok = load_tokenizer_arg(ma, w);
    const model::ModelConfig& c = w.config;
    if (n_dense < 0 || n_dense >= c.n_layers) {
      return report_error(cmd, "--dense " + std::to_string(n_dense) + " must be in [0, " + std::to_string(c.n_layers) +
                                   ") for a " + std::to_string(c.n_layers) + "-layer model", 2);
    }
    if (n_select == 0) n_select = c.n_layers >= 16 ? 3 : c.n_layers >= 8 ? 2 : 1;
    n_select = std::min(n_select, c.n_layers - n_dense);
    const std::vector<std::string> texts = prompts_or_defaults(prompts_file);
    std::vector<std::vector<int32_t>> prompts;
    for (const auto& t : texts) {
      prompts.push_back(tok.encode(t, true, false, c.seq_len));
      if (int64_t(prompts.back().size()) + steps > c.seq_len)
        fail(SIEVE_ERR_INVALID_ARGUMENT, "prompt '" + printable(t, 64) + "' (" + std::to_string(prompts.back().size()) +
                                             " tokens) + " + std::to_string(steps) + " steps exceeds the model's seq_len " +
                                             std::to_string(c.seq_len));
    }
    eo.max_batch = int32_t(prompts.size());
    // The KV pool holds what this study runs, not the model's max_position_embeddings.
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    eo.max_seq_len = int32_t(int64_t(longest) + steps);

    Study s;
    s.page_size = eo.page_size;
    s.budget_pages = int32_t(budget / eo.page_size);
    s.recent = recent;
    s.layers.assign(size_t(c.n_layers), {});
    s.prev.assign(size_t(c.n_layers), {});
    runtime::Registry registry;
    const runtime::ChainSpec on_store = dense_chain_arg(ma, &registry);
    model::Engine engine(w, eo, model::resolve_for_model(on_store, registry, c, eo));
    engine.set_probe([&](const model::LayerProbe& p) { measure(p, c, s); });
    std::vector<int32_t> ids;
    for (size_t b = 0; b < prompts.size(); ++b) ids.push_back(engine.add_sequence());
    std::vector<float> logits;
    std::vector<int32_t> next(prompts.size());
    auto argmax = [&] {
      for (size_t b = 0; b < prompts.size(); ++b) {
        const float* row = logits.data() + b * size_t(c.vocab_size);
        next[b] = int32_t(std::max_element(row, row + c.vocab_size) - row);
      }
    };
    engine.prefill(ids, prompts, &logits);
    argmax();
    for (int32_t i = 0; i < steps; ++i) {
      engine.decode(ids, next, &logits);
      argmax();
    }

    // Suggestion: dense prefix, the first layer after it, then the largest shifts.
    std::vector<int32_t> dense(static_cast<size_t>(n_dense)), select;
    std::iota(dense.begin(), dense.end(), 0);
    if (n_select > 0) select.push_back(n_dense);
    std::vector<int32_t> rest;
    for (int32_t l = n_dense + 1; l < c.n_layers; ++l) rest.push_back(l);
    std::stable_sort(rest.begin(), rest.end(), [&](int32_t a, int32_t b) {
      return s.layers[size_t(a)].tv() > s.layers[size_t(b)].tv();
    });
    for (int32_t i = 0; i + 1 < n_select && i < int32_t(rest.size()); ++i) select.push_back(rest[size_t(i)]);
    std::sort(select.begin(), select.end());
    const std::string chain = "delta@d(token_budget=" + std::to_string(budget) + ", recent=" +
                              std::to_string(recent) + ", dense_layers=" + list_text(dense) +
                              ", select_layers=" + list_text(select) + ")\ndecode:*=delta@d";
    auto role = [&](int32_t l) {
      if (std::find(dense.begin(), dense.end(), l) != dense.end()) return "dense";
      if (std::find(select.begin(), select.end(), l) != select.end()) return "select";
      return "sparse";
    };

    if (json) {
      nlohmann::json j = {{"method", "delta"},  {"model", w.source},      {"device", device_name(eo.device)},
                          {"prompts", texts.size()}, {"steps", steps},   {"page_size", eo.page_size},
                          {"token_budget", budget}, {"recent", recent}, {"dense_layers", dense},
                          {"select_layers", select}, {"chain_file", chain}};
      for (int32_t l = 0; l < c.n_layers; ++l) {
        const LayerShift& a = s.layers[size_t(l)];
        j["layers"].push_back({{"layer", l}, {"shift_tv", a.tv()}, {"shift_rows", a.tv_rows},
                               {"page_turnover", a.turnover()}, {"turnover_rows", a.turnover_rows},
                               {"suggested_role", role(l)}});
      }
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::printf("model: %s\n", describe(w).c_str());
    std::printf("dense greedy decoding: %zu prompts x %d steps, device %s; page %d, K = %lld, L = %lld\n\n",
                texts.size(), steps, device_name(eo.device).c_str(), eo.page_size, static_cast<long long>(budget),
                static_cast<long long>(recent));
    std::printf("%-6s %12s %10s %14s %10s  %s\n", "layer", "shift (TV)", "rows", "page turnover", "rows",
                "suggested");
    for (int32_t l = 0; l < c.n_layers; ++l) {
      const LayerShift& a = s.layers[size_t(l)];
      std::printf("%-6d %12.4f %10lld %14.4f %10lld  %s\n", l, a.tv(), static_cast<long long>(a.tv_rows),
                  a.turnover(), static_cast<long long>(a.turnover_rows), role(l));
    }
    std::printf("\nshift: mean over (step, sequence, head) of the total variation between the head's attention at\n"
                "consecutive decode steps, over the keys both saw (the newer renormalised);\n"
                "page turnover: 1 - overlap of DELTA's chosen earlier pages (top K/P - window by S_u) between\n"
                "consecutive steps, where the sequence exceeds K at both.\n"
                "Suggested (dense prefix, the first layer after it, then the largest shifts):\n%s\n",
                chain.c_str());
  } catch (const std::exception& e) {
    return report_error(cmd, e.what(), 1);
  }
  return 0;
}

}  // namespace sieve::delta
