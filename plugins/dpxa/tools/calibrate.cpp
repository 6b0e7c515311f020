// The dpxa plugin's `calibrate` tool (`sieve calibrate dpxa` = `sieve tool dpxa calibrate`):
// per-(layer, query head) thresholds τ for the dpxa plugin (paper 001 §2.5:
// XAttention "calibrates τ independently per head: a small set of sample sequences is run
// through the model, and for each head τ is chosen so that the selected tiles cover a target
// fraction r of the true attention mass").
//
// Calibration data: a model's dense prefill of the prompts (after every layer the engine's probe
// hands over the layer's queries and cache), or synthetic long contexts from
// reference::make_long_context (--synthetic). For every (layer, q head) and query block the
// estimator's tile scores (plugins/dpxa/math, the plugin's own arithmetic) and the exact tile
// masses (f64 softmax, averaged over the block's queries) are kept; τ is the smallest value whose
// greedy cover reaches a mean recall r of the exact mass (bisection: recall grows with τ).
// Output: a thresholds file (`layer head tau` lines, comments with the recall and density
// reached) for `dpxa(thresholds=FILE)`, and a table or JSON.
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

#include "math/dpxa_math.hpp"
#include "tools/tools.hpp"
#include "sieve/cli/model_args.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/cli/parse_options.hpp"
#include "sieve/model/probe_host.hpp"
#include "sieve/cli/prompts.hpp"
#include "sieve/model/engine.hpp"
#include "sieve/model/model_chain.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/runtime/host_copy.hpp"
#include "sieve/util/error.hpp"

namespace po = boost::program_options;

namespace sieve::dpxa {

using namespace sieve::cli;  // options, the model and prompts every tool shares (core/cli)

namespace {

// Longer than default_prompts(): the calibration rows come from prefill query blocks.
const std::vector<std::string> kDefaultPrompts = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
    "One day, she saw a big red ball in the park. She ran to get it, but a dog took it first.",
    "Tom and his mom went to the store to buy some food. Tom wanted a big cake, but his mom said "
    "no. Tom was sad, so he asked for a small apple instead. His mom smiled and gave him a hug.",
};

struct Study {
  dpxa::Config cfg;
  int32_t n_layers = 0, n_heads = 0;
  std::vector<std::vector<dpxa::CalibrationRow>> rows;  // [layer * n_heads + head]
};

// One sequence of one layer: q [n_new, hq, d] and k [kv_len, hkv, d], token-major f32.
void add_sequence(Study& s, int32_t layer, const float* q, int64_t n_new, const float* k,
                  int64_t kv_len, int32_t hq, int32_t hkv, int32_t d) {
  std::vector<float> qh(size_t(n_new) * d), kh(size_t(kv_len) * d);
  dpxa::Anchors qa, ka;
  dpxa::HeadScores sc;
  std::vector<double> mass;
  for (int32_t g = 0; g < hkv; ++g) {
    for (int64_t p = 0; p < kv_len; ++p)
      std::memcpy(&kh[size_t(p * d)], k + (p * hkv + g) * d, size_t(d) * 4);
    if (s.cfg.estimator == dpxa::kDpxa)
      dpxa::block_anchors(kh.data(), kv_len, d, s.cfg.block, s.cfg.k_threshold, ka);
    for (int32_t h = g * (hq / hkv); h < (g + 1) * (hq / hkv); ++h) {
      for (int64_t i = 0; i < n_new; ++i)
        std::memcpy(&qh[size_t(i * d)], q + (i * hq + h) * d, size_t(d) * 4);
      if (s.cfg.estimator == dpxa::kDpxa)
        dpxa::block_anchors(qh.data(), n_new, d, s.cfg.block, s.cfg.q_threshold, qa);
      dpxa::score_head(s.cfg, qh.data(), n_new, kh.data(), kv_len, d, &qa, &ka, sc);
      dpxa::true_tile_mass(qh.data(), n_new, kh.data(), kv_len, d, s.cfg.block, s.cfg.scale, mass);
      auto& out = s.rows[size_t(layer) * s.n_heads + size_t(h)];
      for (size_t t = 0; t < sc.spans.size(); ++t) {
        dpxa::CalibrationRow r;
        r.span = sc.spans[t];
        r.tiles.assign(sc.tiles.begin() + sc.row_start[t], sc.tiles.begin() + sc.row_start[t + 1]);
        r.mass.assign(mass.begin() + sc.row_start[t], mass.begin() + sc.row_start[t + 1]);
        out.push_back(std::move(r));
      }
    }
  }
}

// A prefill layer from the model: copy q and the cache to the host and add every sequence.
void probe(const model::LayerProbe& p, const model::ModelConfig& c, Study& s) {
  if (p.phase != SIEVE_PHASE_PREFILL || p.batch == 0) return;
  const int32_t n = p.qo_indptr_host[p.batch], hq = c.n_heads, hkv = c.n_kv_heads, d = c.head_dim();
  std::vector<float> q(size_t(n) * hq * d);
  runtime::copy_to_host(*p.services, q.data(), *p.q, q.size() * 4);
  runtime::HostPagedView hv;
  model::probe_cache_to_host(p, "calibrate", &hv);
  const int32_t ps = hv.view.page_size;
  for (int32_t b = 0; b < p.batch; ++b) {
    const int64_t n_new = p.qo_indptr_host[b + 1] - p.qo_indptr_host[b];
    const int32_t pages = hv.indptr.data<int32_t>()[b + 1] - hv.indptr.data<int32_t>()[b];
    const int64_t kv_len = pages ? int64_t(pages - 1) * ps + hv.last_page_len.data<int32_t>()[b] : 0;
    std::vector<float> k(size_t(kv_len) * hkv * d);
    const int32_t* idx = hv.indices.data<int32_t>() + hv.indptr.data<int32_t>()[b];
    for (int64_t t = 0; t < kv_len; ++t)
      for (int32_t g = 0; g < hkv; ++g)
        for (int32_t x = 0; x < d; ++x)
          k[size_t((t * hkv + g) * d + x)] =
              hv.k.get(((int64_t(idx[t / ps]) * hkv + g) * ps + t % ps) * d + x);
    add_sequence(s, p.layer, q.data() + int64_t(p.qo_indptr_host[b]) * hq * d, n_new, k.data(), kv_len,
                 hq, hkv, d);
  }
}

double density(const std::vector<dpxa::CalibrationRow>& rows, float tau) {
  dpxa::GreedyScratch g;
  std::vector<uint8_t> keep;
  int64_t kept = 0, all = 0;
  for (const auto& r : rows) {
    keep.resize(size_t(r.span.n_candidates));
    kept += dpxa::greedy_row(r.span, r.tiles.data(), tau, keep.data(), g);
    all += r.span.n_candidates;
  }
  return all ? double(kept) / double(all) : 1.0;
}

}  // namespace

int calibrate_main(int argc, const char* const* argv) {
  const std::string cmd = argv[0];  // the command as typed: `sieve calibrate dpxa` or `sieve tool dpxa calibrate`
  po::options_description opts(
      cmd + ": per-(layer, head) tau so the dpxa plugin's kept tiles cover a fraction\n"
      "r of the exact attention mass on calibration prefills (a model's prompts, or --synthetic)");
  ModelArgs ma;
  std::string prompts_file, out_file, estimator = "dpxa";
  double target = 0.9, threshold = 0.75;
  int32_t block = 128, stride = 0, syn_tokens = 2048, syn_layers = 1, syn_samples = 2, syn_hq = 8,
          syn_hkv = 2, syn_d = 128;
  uint64_t seed = 1;
  opts.add_options()("help,h", "this help")
      ("target", po::value(&target)->default_value(0.9), "r: mean recall of the exact tile mass to reach, in (0, 1]")
      ("estimator", po::value(&estimator)->default_value("dpxa"), "dpxa | xattn | stride (as the plugin's parameter)")
      ("block", po::value(&block)->default_value(128), "B (as the plugin's parameter)")
      ("threshold", po::value(&threshold)->default_value(0.75), "dpxa anchor cosine threshold (as the plugin's)")
      ("stride", po::value(&stride)->default_value(0), "S for xattn / stride (0: 8 / 4, as the plugin)")
      ("out", po::value(&out_file), "thresholds file to write (dpxa(thresholds=FILE))")
      ("model", po::value(&ma.model), "model file or directory (as sieve run); default: the embedded stories260K")
      ("tokenizer", po::value(&ma.tokenizer), "llama2.c tokenizer file (as sieve run)")
      ("prompts", po::value(&prompts_file), "file with one prompt per line; default: 2 built-in prompts")
      ("device", po::value(&ma.device)->default_value("cpu"), "cpu | cuda[:N]")
      ("page-size", po::value(&ma.page_size)->default_value(16), "tokens per KV page: 16, 32 or 64")
      ("synthetic", "calibrate on synthetic long contexts (reference::make_long_context) instead of a model")
      ("tokens", po::value(&syn_tokens)->default_value(2048), "--synthetic: tokens per sample")
      ("layers", po::value(&syn_layers)->default_value(1), "--synthetic: layers (each its own seeds)")
      ("samples", po::value(&syn_samples)->default_value(2), "--synthetic: samples per layer")
      ("heads", po::value(&syn_hq)->default_value(8), "--synthetic: query heads")
      ("kv-heads", po::value(&syn_hkv)->default_value(2), "--synthetic: KV heads")
      ("head-dim", po::value(&syn_d)->default_value(128), "--synthetic: head dim")
      ("seed", po::value(&seed)->default_value(1), "--synthetic: first seed")
      ("json", "print JSON instead of a table");
  add_kv_store_option(opts, &ma.kv_store);
  po::variables_map vm;
  if (const auto done = parse_options(cmd.c_str(), opts, argc, argv, &vm)) return *done;
  auto usage_error = [&](const std::string& m) {
    return report_error(cmd, m, 2);
  };
  if (!(target > 0 && target <= 1)) return usage_error("--target must be in (0, 1], got " + std::to_string(target));
  Study s;
  if (estimator == "dpxa") s.cfg.estimator = dpxa::kDpxa;
  else if (estimator == "xattn") s.cfg.estimator = dpxa::kXattn;
  else if (estimator == "stride") s.cfg.estimator = dpxa::kStride;
  else return usage_error("--estimator must be dpxa, xattn or stride, got '" + estimator + "'");
  if (block < 16 || block > 256) return usage_error("--block must be in [16, 256], got " + std::to_string(block));
  if (stride < 0 || stride > block) return usage_error("--stride must be in [0, block], got " + std::to_string(stride));
  if (!(threshold >= -1 && threshold <= 1)) return usage_error("--threshold must be in [-1, 1]");
  s.cfg.block = block;
  s.cfg.q_threshold = s.cfg.k_threshold = float(threshold);
  s.cfg.stride = stride ? stride : s.cfg.estimator == dpxa::kXattn ? 8 : 4;
  const bool synthetic = vm.count("synthetic") > 0, json = vm.count("json") > 0;
  if (synthetic && !ma.kv_store.empty()) return usage_error("--kv-store: --synthetic runs no model, so no KV store");
  std::string source;
  try {
    if (synthetic) {
      if (syn_tokens < 1 || syn_layers < 1 || syn_samples < 1 || syn_hq < 1 || syn_hkv < 1 || syn_hq % syn_hkv)
        return usage_error("--tokens, --layers, --samples must be >= 1 and --kv-heads must divide --heads");
      s.n_layers = syn_layers;
      s.n_heads = syn_hq;
      s.cfg.scale = 1.0f / std::sqrt(float(syn_d));
      s.rows.assign(size_t(s.n_layers) * s.n_heads, {});
      for (int32_t l = 0; l < syn_layers; ++l)
        for (int32_t i = 0; i < syn_samples; ++i) {
          reference::LongContextSpec ls;
          ls.n_q_heads = syn_hq;
          ls.n_kv_heads = syn_hkv;
          ls.head_dim = syn_d;
          ls.n_tokens = syn_tokens;
          ls.seed = seed + uint64_t(l) * 1000 + uint64_t(i);
          const reference::LongContext c = reference::make_long_context(ls);
          add_sequence(s, l, c.q.data(), syn_tokens, c.k.data(), syn_tokens, syn_hq, syn_hkv, syn_d);
        }
      source = "synthetic long contexts: " + std::to_string(syn_samples) + " x " + std::to_string(syn_tokens) +
               " tokens per layer, " + std::to_string(syn_hq) + "/" + std::to_string(syn_hkv) + " heads, d " +
               std::to_string(syn_d);
    } else {
      std::string error;
      model::EngineOptions eo;
      if (!engine_options(ma, &eo, &error)) return usage_error(error);
      const model::ModelWeights w = load_model_arg(ma);
      const model::Tokenizer tok = load_tokenizer_arg(ma, w);
      const model::ModelConfig& c = w.config;
      const std::vector<std::string> texts = prompts_or_defaults(prompts_file, kDefaultPrompts);
      s.n_layers = c.n_layers;
      s.n_heads = c.n_heads;
      s.cfg.scale = 1.0f / std::sqrt(float(c.head_dim()));
      s.rows.assign(size_t(s.n_layers) * s.n_heads, {});
      eo.max_batch = 1;
      runtime::Registry registry;
      const runtime::ChainSpec dense = dense_chain_arg(ma, &registry);
      model::Engine engine(w, eo, model::resolve_for_model(dense, registry, c, eo));
      engine.set_probe([&](const model::LayerProbe& p) { probe(p, c, s); });
      std::vector<float> logits;
      for (const auto& t : texts) {  // one prompt at a time: no batch limit on long prompts
        std::vector<int32_t> ids = {engine.add_sequence()};
        std::vector<std::vector<int32_t>> toks = {tok.encode(t, true, false)};
        if (int64_t(toks[0].size()) > c.seq_len) toks[0].resize(size_t(c.seq_len));
        engine.prefill(ids, toks, &logits);
        engine.remove_sequence(ids[0]);
      }
      source = w.source + ", " + std::to_string(texts.size()) + " prompts";
    }

    struct HeadResult {
      int32_t layer, head;
      float tau;
      double recall, density;
      size_t rows;
    };
    std::vector<HeadResult> res;
    for (int32_t l = 0; l < s.n_layers; ++l)
      for (int32_t h = 0; h < s.n_heads; ++h) {
        const auto& rows = s.rows[size_t(l) * s.n_heads + size_t(h)];
        double recall = 0;
        const float tau = dpxa::calibrate_tau(rows, target, &recall);
        res.push_back({l, h, tau, recall, density(rows, tau), rows.size()});
      }
    const std::string params = "estimator=" + estimator + " block=" + std::to_string(block) +
                               " threshold=" + std::to_string(threshold) + " stride=" +
                               std::to_string(s.cfg.stride) + " target=" + std::to_string(target);
    if (!out_file.empty()) {
      std::ofstream f(out_file);
      if (!f) fail(SIEVE_ERR_INVALID_ARGUMENT, "--out '" + out_file + "': cannot write");
      f << "# " << cmd << ": " << params << "\n# data: " << source << "\n# layer head tau\n";
      char line[160];
      for (const auto& r : res) {
        std::snprintf(line, sizeof line, "%d %d %.6f  # recall %.4f density %.4f rows %zu\n", r.layer, r.head,
                      double(r.tau), r.recall, r.density, r.rows);
        f << line;
      }
    }
    if (json) {
      nlohmann::json j = {{"method", "dpxa"}, {"estimator", estimator}, {"block", block},
                          {"threshold", threshold}, {"stride", s.cfg.stride}, {"target", target},
                          {"data", source}, {"out", out_file}};
      for (const auto& r : res)
        j["heads"].push_back({{"layer", r.layer}, {"head", r.head}, {"tau", r.tau}, {"recall", r.recall},
                              {"density", r.density}, {"rows", r.rows}});
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::printf("calibration data: %s\n%s\n\n%-6s %-5s %9s %9s %9s %6s\n", source.c_str(), params.c_str(), "layer",
                "head", "tau", "recall", "density", "rows");
    for (const auto& r : res)
      std::printf("%-6d %-5d %9.4f %9.4f %9.4f %6zu\n", r.layer, r.head, double(r.tau), r.recall, r.density, r.rows);
    if (!out_file.empty()) std::printf("\nwrote %s: use dpxa(thresholds=%s, ...)\n", out_file.c_str(), out_file.c_str());
  } catch (const std::exception& e) {
    return report_error(cmd, e.what(), 1);
  }
  return 0;
}

}  // namespace sieve::dpxa
