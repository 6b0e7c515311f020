#include "sieve/cli/model_args.hpp"

#include <filesystem>

#include "sieve/cli/device_args.hpp"
#include "sieve/cli/embedded_model.hpp"
#include "sieve/model/llama2c.hpp"
#include "sieve/util/error.hpp"

namespace sieve::cli {

model::ModelWeights load_model_arg(const ModelArgs& a) {
  if (a.model.empty()) return model::parse_llama2c(embedded_model(), kEmbeddedModelName);
  return model::load_model(a.model);
}

model::Tokenizer load_tokenizer_arg(const ModelArgs& a, const model::ModelWeights& w) {
  const int32_t vocab = w.config.vocab_size;
  if (!a.tokenizer.empty()) return model::Tokenizer::load(a.tokenizer, vocab);
  if (!a.model.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path p(a.model);
    const fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path();
    for (const std::string& name : {std::string("tokenizer.bin"), "tok" + std::to_string(vocab) + ".bin"}) {
      const fs::path t = dir / name;
      if (fs::is_regular_file(t, ec)) return model::Tokenizer::load(t.string(), vocab);
    }
  }
  if (vocab == 512) return model::Tokenizer::parse(embedded_tokenizer(), vocab, kEmbeddedTokenizerName);
  fail(SIEVE_ERR_NOT_FOUND, "model '" + a.model + "' has a vocabulary of " + std::to_string(vocab) +
                                " tokens and no tokenizer.bin beside it: name a llama2.c tokenizer with --tokenizer");
}

bool engine_options(const ModelArgs& a, model::EngineOptions* o, std::string* error) {
  const std::optional<DLDevice> device = parse_device_arg(a.device);
  if (!device) {
    *error = bad_device_message(a.device);
    return false;
  }
  o->device = *device;
  const std::optional<DLDataType> kv_dtype = parse_dtype_arg(a.kv_dtype);
  if (!kv_dtype) {
    *error = bad_dtype_message("--kv-dtype", a.kv_dtype);
    return false;
  }
  o->kv_dtype = *kv_dtype;
  if (a.page_size != 16 && a.page_size != 32 && a.page_size != 64) {
    *error = "--page-size must be 16, 32 or 64, got " + std::to_string(a.page_size);
    return false;
  }
  o->page_size = a.page_size;
  return true;
}

bool discover_plugins(const ModelArgs& a, runtime::Registry* out, std::string* error) {
  runtime::DiscoveryOptions d;
  d.plugin_dirs = a.plugin_dirs;
  *out = runtime::Registry::discover(d);
  for (const auto& m : out->missing_dirs()) {
    *error = "plugin directory '" + m + "' does not exist";
    return false;
  }
  return true;
}

void add_kv_store_option(boost::program_options::options_description& opts, std::string* text) {
  opts.add_options()("kv-store", boost::program_options::value(text),
                     "the KV store: NAME or NAME(k=v,...) (`sieve plugins` lists them; default: the chain's "
                     "kv_store line, else paged)");
}

runtime::ChainSpec chain_arg(const std::string& chain, const std::string& kv_store) {
  runtime::ChainSpec spec;
  std::string error;
  if (!chain.empty() && !runtime::parse_chain_argument(chain, &spec, &error)) fail(SIEVE_ERR_INVALID_ARGUMENT, error);
  if (!runtime::apply_store_argument(kv_store, &spec, &error)) fail(SIEVE_ERR_INVALID_ARGUMENT, "--kv-store: " + error);
  return spec;
}

runtime::ChainSpec dense_chain_arg(const ModelArgs& a, runtime::Registry* registry) {
  runtime::ChainSpec spec = chain_arg("", a.kv_store);
  std::string error;
  if (!a.kv_store.empty() && !discover_plugins(a, registry, &error)) fail(SIEVE_ERR_NOT_FOUND, error);
  return spec;
}

std::string describe(const model::ModelWeights& w) {
  const auto& c = w.config;
  return w.source + " (" + w.format + ": dim " + std::to_string(c.dim) + ", " + std::to_string(c.n_layers) +
         " layers, " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads, head dim " +
         std::to_string(c.head_dim()) + ", vocab " + std::to_string(c.vocab_size) + ", " +
         std::to_string(w.parameter_count()) + " parameters)";
}

}  // namespace sieve::cli
