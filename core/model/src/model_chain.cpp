#include "sieve/model/model_chain.hpp"

#include <vector>

#include "sieve/util/error.hpp"

namespace sieve::model {

runtime::ChainSpec parse_chain_argument(const std::string& text) {
  runtime::ChainSpec spec;
  std::string error;
  if (!runtime::parse_chain_argument(text, &spec, &error))
    fail(SIEVE_ERR_INVALID_ARGUMENT, error);
  return spec;
}

runtime::ResolvedChains resolve_for_model(const runtime::ChainSpec& spec, const runtime::Registry& registry,
                                          const ModelConfig& config, const EngineOptions& options) {
  runtime::ResolvedChains chains;
  std::vector<std::string> errors;
  if (!runtime::resolve_chains(spec, registry, Engine::geometry_for(config, options), &chains, &errors)) {
    std::string all;
    for (const auto& e : errors) all += (all.empty() ? "" : "\n") + e;
    fail(SIEVE_ERR_INVALID_ARGUMENT, all);
  }
  return chains;
}

}  // namespace sieve::model
