#include "model_args.hpp"

#include <filesystem>

#include "embedded_model.hpp"
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
  if (a.device == "cpu") {
    o->device = kCpu;
  } else if (a.device == "cuda") {
    o->device = DLDevice{kDLCUDA, 0};
  } else if (a.device.rfind("cuda:", 0) == 0 && a.device.size() > 5 &&
             a.device.find_first_not_of("0123456789", 5) == std::string::npos) {
    o->device = DLDevice{kDLCUDA, std::stoi(a.device.substr(5))};
  } else {
    *error = "--device must be cpu or cuda[:N], got '" + a.device + "'";
    return false;
  }
  if (a.kv_dtype == "f32") o->kv_dtype = kF32;
  else if (a.kv_dtype == "f16") o->kv_dtype = kF16;
  else if (a.kv_dtype == "bf16") o->kv_dtype = kBF16;
  else {
    *error = "--kv-dtype must be f32, f16 or bf16, got '" + a.kv_dtype + "'";
    return false;
  }
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

std::string describe(const model::ModelWeights& w) {
  const auto& c = w.config;
  return w.source + " (" + w.format + ": dim " + std::to_string(c.dim) + ", " + std::to_string(c.n_layers) +
         " layers, " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads, head dim " +
         std::to_string(c.head_dim()) + ", vocab " + std::to_string(c.vocab_size) + ", " +
         std::to_string(w.parameter_count()) + " parameters)";
}

}  // namespace sieve::cli
