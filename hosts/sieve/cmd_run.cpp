// sieve run: generate text with a model whose every attention call goes through the runtime
// (the layer's chain, or the core's dense kernel). With no arguments: the embedded stories260K,
// CPU, greedy from BOS, 256 tokens — the README's main command.
#include <boost/program_options.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/cli/model_args.hpp"
#include "sieve/cli/parse_options.hpp"
#include "sieve/model/generate.hpp"
#include "sieve/model/model_chain.hpp"
#include "sieve/util/error.hpp"

namespace po = boost::program_options;

namespace sieve::cli {

int cmd_run(int argc, char** argv) {
  po::options_description opts("sieve run: generate text with a model, attention through the runtime");
  ModelArgs ma;
  std::string prompt, chain_text, kv_trace;
  model::GenerateOptions go;
  opts.add_options()("help,h", "this help")
      ("model", po::value(&ma.model), "llama2.c checkpoint, or a safetensors model (directory, config.json or "
                                      ".safetensors file); default: the embedded stories260K")
      ("tokenizer", po::value(&ma.tokenizer), "llama2.c tokenizer file; default: tokenizer.bin beside the model, "
                                              "else the embedded tok512 (vocab 512)")
      ("prompt", po::value(&prompt)->default_value(""), "text to continue (BOS is always prepended)")
      ("steps", po::value(&go.steps)->default_value(256), "tokens to generate (stops early at BOS/EOS)")
      ("temperature", po::value(&go.temperature)->default_value(0.f), "0: greedy; > 0: sample softmax(logits/T)")
      ("seed", po::value(&go.seed)->default_value(1), "sampling seed")
      ("device", po::value(&ma.device)->default_value("cpu"), "cpu | cuda[:N]")
      ("chain", po::value(&chain_text), "chain spec, e.g. 'decode:*=streaming(sink=4,window=64)'; a bare chain means "
                                        "every layer; default: the core's dense attention")
      ("page-size", po::value(&ma.page_size)->default_value(16), "tokens per KV page: 16, 32 or 64")
      ("kv-dtype", po::value(&ma.kv_dtype)->default_value("f32"), "KV storage: f32 | f16 | bf16")
      ("plugin-dir", po::value(&ma.plugin_dirs), "extra plugin directory (searched first; repeatable)")
      ("ignore-eos", po::bool_switch(), "keep generating through BOS/EOS (fixed lengths, e.g. for --kv-trace)")
      ("kv-trace", po::value(&kv_trace), "write the store's resident KV bytes after the prefill and every decode "
                                         "step to this CSV file (step,tokens,kv_bytes)");
  add_kv_store_option(opts, &ma.kv_store);
  po::variables_map vm;
  if (const auto done = parse_options("sieve run", opts, argc, argv, &vm)) return *done;
  if (go.steps < 1) {
    std::fprintf(stderr, "sieve run: --steps must be >= 1, got %d\n", go.steps);
    return 2;
  }
  if (go.temperature < 0.f) {
    std::fprintf(stderr, "sieve run: --temperature must be >= 0, got %g\n", double(go.temperature));
    return 2;
  }
  if (vm["ignore-eos"].as<bool>()) go.stop_at_bos_eos = false;
  model::EngineOptions eo;
  std::string error;
  if (!engine_options(ma, &eo, &error)) {
    return report_error("sieve run", error, 2);
  }
  eo.max_batch = 1;
  try {
    runtime::Registry registry;
    const runtime::ChainSpec spec = chain_arg(chain_text, ma.kv_store);
    if (!chain_text.empty() || !ma.kv_store.empty())  // the built-in stores need no discovery
      if (!discover_plugins(ma, &registry, &error)) fail(SIEVE_ERR_NOT_FOUND, error);
    const model::ModelWeights w = load_model_arg(ma);
    const model::Tokenizer tok = load_tokenizer_arg(ma, w);
    const std::vector<int32_t> prompt_tokens = tok.encode(prompt, true, false, w.config.seq_len);
    // The KV pool (and the plugins' scratch) is sized for what this run holds, not for the
    // model's max_position_embeddings, which a config may set to 2^31.
    eo.max_seq_len = int32_t(std::min<int64_t>(w.config.seq_len, int64_t(prompt_tokens.size()) + go.steps - 1));
    model::Engine engine(w, eo, model::resolve_for_model(spec, registry, w.config, eo));
    std::FILE* trace = nullptr;
    if (!kv_trace.empty()) {
      trace = std::fopen(kv_trace.c_str(), "w");
      if (!trace) fail(SIEVE_ERR_INVALID_ARGUMENT, "--kv-trace: cannot write '" + kv_trace + "'");
      std::fprintf(trace, "step,tokens,kv_bytes\n");
      // tokens: what the sequence holds (prompt, then one more per decode step), evicted ones included.
      go.after_step = [&](int32_t step) {
        std::fprintf(trace, "%d,%lld,%llu\n", step, static_cast<long long>(prompt_tokens.size()) + step,
                     static_cast<unsigned long long>(engine.kv_bytes()));
      };
    }
    struct CloseTrace {
      std::FILE*& f;
      ~CloseTrace() {
        if (f) std::fclose(f);
      }
    } close_trace{trace};
    model::GenerationStats st;
    const auto gen = model::generate(engine, {prompt_tokens}, go, &st);

    // The text: the prompt (after BOS) and the continuation, as one decode.
    std::vector<int32_t> all(prompt_tokens.begin() + 1, prompt_tokens.end());
    all.insert(all.end(), gen[0].tokens.begin(), gen[0].tokens.end());
    std::printf("%s\n\n", tok.decode(all, model::Tokenizer::kBos).c_str());
    std::printf("model: %s\n", describe(w).c_str());
    std::printf("device: %s, chain: %s\n", device_name(eo.device).c_str(),
                spec.empty() ? "none (core dense attention)" : runtime::to_string(spec).c_str());
    // Decode speed: one token per decode step (the first generated token comes from the prefill).
    const double steps = double(engine.decode_steps());
    const double tps = st.decode_seconds > 0 ? steps / st.decode_seconds : 0.0;
    std::printf("prompt %lld tokens, prefill %.2f ms; generated %lld tokens, %.0f decode steps at %.1f tokens/s; "
                "KV bytes %llu\n",
                static_cast<long long>(st.prompt_tokens), 1e3 * st.prefill_seconds,
                static_cast<long long>(st.generated_tokens), steps, tps, static_cast<unsigned long long>(st.kv_bytes));
  } catch (const std::exception& e) {
    return report_error("sieve run", e.what(), 1);
  }
  return 0;
}

}  // namespace sieve::cli
