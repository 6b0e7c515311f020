// A chain for a model: reading a --chain argument and resolving it for an engine of the model
// (what `sieve run`, `sieve eval`, the calibrations and the tools share; the fidelity evaluation,
// fidelity_eval.hpp, builds on it).
#pragma once
#include <string>

#include "sieve/model/engine.hpp"
#include "sieve/model/model.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/registry.hpp"

namespace sieve::model {

// A --chain argument: the compact chain grammar (chain_spec.hpp), where a bare chain without
// a layer rule ("streaming(window=64)") means every layer and both phases. Throws sieve::Error.
runtime::ChainSpec parse_chain_argument(const std::string& text);

// Resolve `spec` for an engine of this model and options; throws sieve::Error carrying every
// resolution problem (one per line).
runtime::ResolvedChains resolve_for_model(const runtime::ChainSpec& spec, const runtime::Registry& registry,
                                          const ModelConfig& config, const EngineOptions& options);

}  // namespace sieve::model
