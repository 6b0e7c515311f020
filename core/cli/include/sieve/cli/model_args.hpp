// What `sieve run` and `sieve eval` share: loading the model and tokenizer (the embedded default
// unless --model / --tokenizer say otherwise), the engine options, the plugin registry.
#pragma once
#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "sieve/model/engine.hpp"
#include "sieve/model/model.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/registry.hpp"

namespace sieve::cli {

struct ModelArgs {
  std::string model;      // "" = embedded stories260K
  std::string tokenizer;  // "" = tokenizer.bin beside the model, else the embedded tok512 (vocab 512)
  std::string device = "cpu";
  std::string kv_dtype = "f32";
  int32_t page_size = 16;
  std::vector<std::string> plugin_dirs;
  std::string kv_store;   // --kv-store NAME(k=v,...); "" = the chain's, else "paged"
};

// The --kv-store option, described once for every command that makes a session.
void add_kv_store_option(boost::program_options::options_description& opts, std::string* text);
// A --chain argument (bare: every layer; "": dense) with --kv-store applied; throws sieve::Error
// with one line on bad text or a chain that already names another store.
runtime::ChainSpec chain_arg(const std::string& chain, const std::string& kv_store);
// The chain of a command that runs the model densely (calibration, distillation): dense attention
// on a.kv_store. A named store is found by plugin discovery into *registry (a plugin may ship it;
// dense on the default store needs none). Throws sieve::Error with one line.
runtime::ChainSpec dense_chain_arg(const ModelArgs& a, runtime::Registry* registry);

// Both throw sieve::Error with one line.
model::ModelWeights load_model_arg(const ModelArgs& a);
model::Tokenizer load_tokenizer_arg(const ModelArgs& a, const model::ModelWeights& w);
// Device, KV dtype and page size; false with a message on a bad value.
bool engine_options(const ModelArgs& a, model::EngineOptions* out, std::string* error);
// Plugin discovery (--plugin-dir first); false with a message when an explicit dir is missing.
bool discover_plugins(const ModelArgs& a, runtime::Registry* out, std::string* error);

std::string describe(const model::ModelWeights& w);

}  // namespace sieve::cli
