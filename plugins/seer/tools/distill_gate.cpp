// The seer plugin's `distill-gate` tool (`sieve distill-gate` = `sieve tool seer distill-gate`):
// self-distil a SeerAttention-R AttnGate for a model (paper 002 §2.3) and
// write it as a gate file for the `seer` plugin.
//
// The model stays frozen. It generates its own training text (sampled at temperature 1 from BOS,
// one seed per batch of sequences, BOS/EOS not stopping it), then every sequence is prefilled
// once with a probe that reads, per layer, the post-RoPE queries and the keys in the KV store;
// the pre-RoPE vectors the gate takes are recovered by rotating back (RoPE is a rotation). The
// ground truth and the training are gate/distill.hpp's (CPU, deterministic for a seed). Held-out
// sequences (a different seed range) give the final KL and the gate's block recall.
// --random writes the untrained initialisation (tests, conformance, speed runs).
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "sieve/cli/error_line.hpp"
#include "gate/distill.hpp"
#include "gate/gate_file.hpp"
#include "gate/gate_math.hpp"
#include "tools/tools.hpp"
#include "sieve/plugin/tool.hpp"
#include "sieve/cli/model_args.hpp"
#include "sieve/cli/parse_options.hpp"
#include "sieve/model/model_chain.hpp"
#include "sieve/model/generate.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/page_layout.hpp"
#include "sieve/util/tensor.hpp"

namespace po = boost::program_options;

namespace sieve::seer {

using namespace sieve::cli;  // options, the model and prompts every tool shares (core/cli)

namespace {

struct LayerCapture {
  std::vector<std::vector<float>> q_post, k_post;  // per layer [T, heads, d]
};

// Prefill `tokens` into a fresh sequence and capture each layer's post-RoPE q and K.
LayerCapture capture(model::Engine& engine, const std::vector<int32_t>& tokens) {
  const model::ModelConfig& c = engine.config();
  const int32_t T = int32_t(tokens.size()), d = c.head_dim();
  LayerCapture cap;
  cap.q_post.resize(size_t(c.n_layers));
  cap.k_post.resize(size_t(c.n_layers));
  const int32_t seq = engine.add_sequence();
  engine.set_probe([&](const model::LayerProbe& p) {
    const int64_t nq = int64_t(T) * c.n_heads * d;
    std::vector<float>& q = cap.q_post[size_t(p.layer)];
    q.resize(size_t(nq));
    for (int64_t i = 0; i < nq; ++i) q[size_t(i)] = load_float(data_ptr<const void>(*p.q), p.q->dtype, i);
    sieve_paged_kv view{};
    view.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    if (sieve_status st = p.kv_api->view(p.kv, p.layer, &seq, 1, &view); st != SIEVE_OK)
      fail(st, std::string("KV view: ") + p.kv_api->last_error(p.kv));
    const int32_t P = view.page_size, hkv = c.n_kv_heads;
    const auto* pages = data_ptr<const int32_t>(view.indices);
    PageStrides at;
    if (std::string e = page_strides(view.k_pages, "KV view: k_pages", &at); !e.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    std::vector<float>& k = cap.k_post[size_t(p.layer)];
    k.resize(size_t(T) * hkv * d);
    for (int32_t t = 0; t < T; ++t)
      for (int32_t h = 0; h < hkv; ++h)
        for (int32_t ch = 0; ch < d; ++ch)
          k[(size_t(t) * hkv + h) * d + ch] = load_float(
              data_ptr<const void>(view.k_pages), view.k_pages.dtype, at.row(pages[t / P], h, t % P) + ch);
  });
  std::vector<float> logits;
  engine.prefill(std::span<const int32_t>(&seq, 1), {tokens}, &logits);
  engine.set_probe(nullptr);
  engine.remove_sequence(seq);
  return cap;
}

// Undo the model's RoPE: x [T, heads, d] at positions 0..T-1.
std::vector<float> unrotate(const std::vector<float>& x, int32_t T, int32_t heads, int32_t d, float theta) {
  std::vector<float> out = x;
  for (int32_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < heads; ++h) seer::rope_rotate(out.data() + (size_t(t) * heads + h) * d, d, t, theta, true);
  return out;
}

}  // namespace

int distill_gate_main(int argc, const char* const* argv) {
  const std::string cmd = argv[0];  // the command as typed: `sieve distill-gate` or `sieve tool seer distill-gate`
  po::options_description opts(
      cmd + ": self-distil a SeerAttention-R gate (W_q, W_k per layer and KV head) for the seer plugin");
  ModelArgs ma;
  std::string out;
  int32_t block = 64, gate_dim = 32, tokens = 0, train_n = 24, held_n = 8;
  seer::DistillOptions dopt;
  bool rmsnorm = false, random_only = false;
  opts.add_options()("help,h", "this help")
      ("model", po::value(&ma.model), "llama2.c checkpoint or safetensors model; default: the embedded stories260K")
      ("out", po::value(&out), "gate file to write (safetensors)")
      ("block", po::value(&block)->default_value(64), "tokens per key block: 16, 32, 64 or 128")
      ("gate-dim", po::value(&gate_dim)->default_value(32), "gate width d_gate (even)")
      ("steps", po::value(&dopt.steps)->default_value(300), "AdamW steps (lr 1e-3, cosine decay)")
      ("batch", po::value(&dopt.batch)->default_value(4), "sequences per step")
      ("seed", po::value(&dopt.seed)->default_value(1), "seed of the text sampling, the init and the batch order")
      ("sequences", po::value(&train_n)->default_value(24), "training sequences the model generates")
      ("held-out", po::value(&held_n)->default_value(8), "held-out sequences (other sampling seeds)")
      ("tokens", po::value(&tokens)->default_value(0), "tokens per sequence; 0: the model's seq_len")
      ("rmsnorm", po::bool_switch(&rmsnorm), "RMSNorm inside the gate (the plugin then needs rmsnorm=true)")
      ("random", po::bool_switch(&random_only), "write the random initialisation, no training");
  add_kv_store_option(opts, &ma.kv_store);
  po::variables_map vm;
  if (const auto done = parse_options(cmd.c_str(), opts, argc, argv, &vm)) return *done;
  auto usage_error = [&](const std::string& m) {
    return report_error(cmd, m, 2);
  };
  if (out.empty()) return usage_error("--out is required (the gate file to write)");
  if (dopt.steps < 1) return usage_error("--steps must be >= 1, got " + std::to_string(dopt.steps));
  if (dopt.batch < 1) return usage_error("--batch must be >= 1, got " + std::to_string(dopt.batch));
  if (train_n < 1 || held_n < 1) return usage_error("--sequences and --held-out must be >= 1");
  if (random_only && !ma.kv_store.empty()) return usage_error("--kv-store: --random runs no model, so no KV store");
  try {
    const model::ModelWeights w = load_model_arg(ma);
    const model::ModelConfig& c = w.config;
    seer::GateShape shape;
    shape.n_layers = c.n_layers;
    shape.n_q_heads = c.n_heads;
    shape.n_kv_heads = c.n_kv_heads;
    shape.head_dim = c.head_dim();
    shape.block = block;
    shape.gate_dim = gate_dim;
    shape.rmsnorm = rmsnorm;
    shape.rope_theta = c.rope_theta;
    if (std::string p = shape.problem(); !p.empty()) return usage_error(p);
    if (tokens == 0) tokens = c.seq_len;
    if (tokens < 2 * block || tokens > c.seq_len)
      return usage_error("--tokens " + std::to_string(tokens) + " must be in [2 * block = " + std::to_string(2 * block) +
                         ", seq_len = " + std::to_string(c.seq_len) + "]");
    seer::GateWeights gate = seer::random_gate(shape, dopt.seed);
    std::printf("model: %s\n", describe(w).c_str());
    if (random_only) {
      seer::write_gate(out, gate);
      std::printf("wrote %s: random initialisation, block %d, gate_dim %d%s\n", out.c_str(), block, gate_dim,
                  rmsnorm ? ", rmsnorm" : "");
      return 0;
    }

    // 1. The model writes its own text.
    const auto t0 = std::chrono::steady_clock::now();
    model::EngineOptions eo;
    std::string error;
    if (!engine_options(ma, &eo, &error)) return usage_error(error);
    eo.max_batch = 8;
    runtime::Registry registry;
    const runtime::ChainSpec dense = dense_chain_arg(ma, &registry);
    model::Engine engine(w, eo, model::resolve_for_model(dense, registry, c, eo));
    // The sequences start from BOS alone (what encoding "" with bos gives): no tokenizer needed,
    // so a model without one (hosts/sieve/models/longctx) distils too.
    const std::vector<int32_t> bos = {model::Tokenizer::kBos};
    auto sample = [&](int32_t n, uint64_t seed_base) {
      std::vector<std::vector<int32_t>> seqs;
      for (int32_t start = 0; start < n; start += eo.max_batch) {
        const int32_t m = std::min(eo.max_batch, n - start);
        model::GenerateOptions go;
        go.steps = tokens - int32_t(bos.size());
        go.temperature = 1.f;
        go.seed = seed_base + uint64_t(start);
        go.stop_at_bos_eos = false;
        for (const auto& g : model::generate(engine, std::vector<std::vector<int32_t>>(size_t(m), bos), go)) {
          std::vector<int32_t> all = g.prompt;
          all.insert(all.end(), g.tokens.begin(), g.tokens.end());
          seqs.push_back(std::move(all));
        }
      }
      return seqs;
    };
    const auto train_text = sample(train_n, dopt.seed * 1000003ULL);
    const auto held_text = sample(held_n, dopt.seed * 1000003ULL + 500000ULL);

    // 2. Gate inputs and ground truth.
    auto prepare = [&](const std::vector<std::vector<int32_t>>& texts) {
      std::vector<seer::DistillSequence> data;
      for (const auto& text : texts) {
        const int32_t T = int32_t(text.size());
        LayerCapture cap = capture(engine, text);
        std::vector<std::vector<float>> q_pre, k_pre;
        for (int32_t L = 0; L < c.n_layers; ++L) {
          q_pre.push_back(unrotate(cap.q_post[size_t(L)], T, c.n_heads, c.head_dim(), c.rope_theta));
          k_pre.push_back(unrotate(cap.k_post[size_t(L)], T, c.n_kv_heads, c.head_dim(), c.rope_theta));
        }
        data.push_back(seer::make_distill_sequence(shape, T, std::move(q_pre), std::move(k_pre), cap.q_post, cap.k_post));
      }
      return data;
    };
    const auto train = prepare(train_text);
    const auto held = prepare(held_text);
    const double prep_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("data: %d training + %d held-out sequences of %d tokens (sampled, T=1), block %d, gate_dim %d%s "
                "(%.1f s)\n",
                train_n, held_n, tokens, block, gate_dim, rmsnorm ? ", rmsnorm" : "", prep_s);

    // 3. Train.
    const seer::GateEval before = seer::evaluate_gate(gate, held);
    const auto t1 = std::chrono::steady_clock::now();
    const int32_t every = std::max(1, dopt.steps / 6);
    double window = 0;
    seer::distill_gate(gate, train, dopt, [&](int32_t step, double kl) {
      window += kl;
      if ((step + 1) % every == 0 || step + 1 == dopt.steps) {
        const int32_t n = (step + 1) % every ? (step + 1) % every : every;
        std::printf("step %d/%d: train KL %.4f\n", step + 1, dopt.steps, window / n);
        std::fflush(stdout);
        window = 0;
      }
    });
    const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const seer::GateEval after = seer::evaluate_gate(gate, held);
    std::printf("held-out (%lld rows): KL %.4f -> %.4f; attention recall on the top 25%% of complete blocks: "
                "gate %.4f (untrained %.4f, oracle %.4f)\n",
                static_cast<long long>(after.positions), before.kl, after.kl, after.gate_recall, before.gate_recall,
                after.oracle_recall);
    std::printf("final KL %.4f, block recall %.4f (%.1f s training)\n", after.kl, after.gate_recall, train_s);
    seer::write_gate(out, gate);
    std::printf("wrote %s\n", out.c_str());
  } catch (const std::exception& e) {
    return report_error(cmd, e.what(), 1);
  }
  return 0;
}

}  // namespace sieve::seer

// The tool module's export: the plugin's kTools entry runs it (sp::module_tool).
SIEVE_EXPORT_TOOL(sieve_seer_distill_gate, sieve::seer::distill_gate_main)
